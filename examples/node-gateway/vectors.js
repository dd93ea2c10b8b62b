'use strict';
// Checks the gateway's recipes against docs/vectors/ (needs the registry: it compares
// the registered schema texts' sha256 and the Avro bodies too).
const fs = require('fs'); const zlib = require('zlib');
const path = require('path');
const gw = require('./gateway');
const V = (f) => JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'docs', 'vectors', f), 'utf8'));
let ok = 0, bad = 0;
const check = (name, got, want) => { if (got === want) ok++; else { bad++; console.log('MISMATCH', name, '\n got ', String(got).slice(0, 200), '\n want', String(want).slice(0, 200)); } };
(async () => {
  const E = V('effect-ids.json');
  for (const c of V('canonical-json.json').cases) {
    let got; try { got = gw.canonical(gw.parseExact(c.input_json)); } catch (e) { got = 'ERROR ' + e.message; }
    check('canon ' + c.name, got, c.canonical);
    if (got === c.canonical) check('canon sha ' + c.name, gw.sha256(got), c.sha256);
  }
  for (const c of V('canonical-json.json').errors) {
    let refused = false; try { gw.canonical(gw.parseExact(c.input_json)); } catch { refused = true; }
    check('refused ' + c.name, refused, true);
  }
  for (const c of E.call_arguments_digests) check('call args ' + JSON.stringify(c.call).slice(0, 60), gw.argumentsDigest(c.call), c.arguments_digest);
  for (const c of E.arguments_digests) check('args', gw.sha256(gw.canonical(gw.parseExact(c.arguments))), c.arguments_digest);
  for (const c of E.effect_ids) check('eff', gw.effectId(c.idempotency_key, c.subturn_index, c.call_id), c.effect_id);
  for (const c of E.claimed_effect_ids) check('ceff', gw.claimedEffectId(c.idempotency_key, c.subturn_index, c.tool_name, c.occurrence), c.effect_id);
  for (const c of V('fingerprints.json').cases) check('fp ' + c.name, gw.fingerprintHash(c.fingerprint), c.fingerprint_hash);
  for (const c of V('items.json').cases) { const it = gw.item(c.object); check('item', it.content.toString(), c.content); check('itemd', it.content_digest, c.content_digest); check('item record ' + c.object.type, JSON.stringify([it.item_id, it.type, it.role, it.call_id, it.format_version]), JSON.stringify([c.item.item_id, c.item.type, c.item.role, c.item.call_id, c.item.format_version])); }
  for (const c of V('partition-keys.json').cases) { const k = gw.partitionKey(c.event); check('pk', k, c.key); check('crc', zlib.crc32(Buffer.from(k)) >>> 0, c.crc32); check('part', (zlib.crc32(Buffer.from(k)) >>> 0) % 12, c.partition_of_12); }
  for (const c of V('request-digests.json').cases) check('rd', gw.sha256(gw.canonical(c.request)), c.request_digest);
  for (const c of V('events.json').cases) {
    const s = await gw.schemaFor(c.record);
    check('schema sha ' + c.record, s.sha256, c.schema_sha256);
    const v = JSON.parse(JSON.stringify(c.value));
    const fix = (it) => { it.content = Buffer.from(it.content, 'utf8'); };
    if (v.input_items) { v.input_items.forEach(fix); v.output_items.forEach(fix); }
    if (v.output && v.output.content) fix(v.output);
    check('body ' + c.record, s.type.toBuffer(v).toString('hex'), c.avro_body_hex);
    check('key ' + c.record, gw.partitionKey(c.value), c.key);
  }
  console.log(`vectors: ${ok} ok, ${bad} mismatched`);
  process.exit(bad ? 1 : 0);
})().catch((e) => { console.error(e); process.exit(1); });

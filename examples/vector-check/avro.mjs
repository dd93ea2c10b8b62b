// Minimal Avro binary writer for the three gateway events, from the registry's schema text.
import fs from 'node:fs';
import { schemaTexts, sha256 } from './schema-text.mjs';
// usage: node avro.mjs <docs/vectors> <schemas>
const V = JSON.parse(fs.readFileSync(process.argv[2] + '/events.json', 'utf8'));
const texts = schemaTexts(process.argv[3]);
const zz = (n) => { n = BigInt(n); let u = n >= 0n ? n << 1n : ((-n) << 1n) - 1n; const out = []; do { let b = Number(u & 0x7fn); u >>= 7n; if (u) b |= 0x80; out.push(b); } while (u); return Buffer.from(out); };
function enc(t, v, named) {
  if (typeof t === 'string') {
    switch (t) {
      case 'null': return Buffer.alloc(0);
      case 'boolean': return Buffer.from([v ? 1 : 0]);
      case 'int': case 'long': return zz(v);
      case 'string': case 'bytes': { const b = Buffer.from(v, 'utf8'); return Buffer.concat([zz(b.length), b]); }
      default: return enc(named[t] ?? named['io.ratchet.' + t], v, named);
    }
  }
  if (Array.isArray(t)) { // union: pick branch by value
    const idx = v === null ? t.indexOf('null') : t.findIndex((b) => b !== 'null');
    return Buffer.concat([zz(idx), enc(t[idx], v, named)]);
  }
  if (t.type === 'record') { named[t.name] = t; named[`${t.namespace}.${t.name}`] = t; return Buffer.concat(t.fields.map((f) => enc(f.type, v[f.name], named))); }
  if (t.type === 'enum') { named[t.name] = t; named[`${t.namespace}.${t.name}`] = t; const i = t.symbols.indexOf(v); if (i < 0) throw new Error('enum ' + v); return zz(i); }
  if (t.type === 'array') return v.length ? Buffer.concat([zz(v.length), ...v.map((x) => enc(t.items, x, named)), zz(0)]) : zz(0);
  if (t.type === 'map') { const e = Object.entries(v); return e.length ? Buffer.concat([zz(e.length), ...e.flatMap(([k, x]) => [enc('string', k), enc(t.values, x, named)]), zz(0)]) : zz(0); }
  return enc(t.type, v, named); // primitive with logicalType
}
let bad = 0;
for (const c of V.cases) {
  if (sha256(texts[c.record]) !== c.schema_sha256) { bad++; console.log(c.record, 'SCHEMA TEXT MISMATCH'); }
  const schema = JSON.parse(texts[c.record]);
  const body = enc(schema, c.value, {}).toString('hex');
  const ok = body === c.avro_body_hex; if (!ok) bad++;
  const wire = '00' + (42).toString(16).padStart(8, '0') + body;
  console.log(c.record, ok ? 'body reproduced' : 'BODY MISMATCH', wire === c.wire_value_hex_if_schema_id_is_42 ? 'wire reproduced' : 'WIRE MISMATCH', Buffer.from(c.key).toString('hex') === c.key_hex ? 'key ok' : 'KEY MISMATCH');
}
process.exit(bad ? 1 : 0);

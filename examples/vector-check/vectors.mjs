// Independent recomputation of docs/vectors from docs/gateway-protocol.md's words alone.
import fs from 'node:fs';
import crypto from 'node:crypto';
import zlib from 'node:zlib';
const V = process.argv[2];
const load = (f) => JSON.parse(fs.readFileSync(`${V}/${f}`, 'utf8'));
const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');
let fails = 0, checks = 0;
const eq = (what, got, want) => { checks++; if (got !== want) { fails++; console.log('MISMATCH', what, '\n  got ', got, '\n  want', want); } };

// --- strict lossless JSON parser: numbers keep their text; ints -> BigInt, others -> {f: double}
class F { constructor(v) { this.v = v; } }
function parse(text) {
  let i = 0;
  const ws = () => { while (i < text.length && ' \t\n\r'.includes(text[i])) i++; };
  const err = (m) => { throw new Error(`${m} at ${i}`); };
  function val(depth) {
    ws();
    const c = text[i];
    if (c === '{') {
      i++; const o = new Map(); ws();
      if (text[i] === '}') { i++; return o; }
      for (;;) {
        ws(); if (text[i] !== '"') err('key'); const k = str();
        if (o.has(k)) err('duplicate key'); ws(); if (text[i++] !== ':') err(':');
        o.set(k, val(depth + 1)); ws();
        if (text[i] === ',') { i++; continue; } if (text[i] === '}') { i++; return o; } err('obj');
      }
    }
    if (c === '[') {
      i++; const a = []; ws();
      if (text[i] === ']') { i++; return a; }
      for (;;) { a.push(val(depth + 1)); ws(); if (text[i] === ',') { i++; continue; } if (text[i] === ']') { i++; return a; } err('arr'); }
    }
    if (c === '"') return str();
    if (text.startsWith('true', i)) { i += 4; return true; }
    if (text.startsWith('false', i)) { i += 5; return false; }
    if (text.startsWith('null', i)) { i += 4; return null; }
    const m = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(text.slice(i));
    if (!m) err('value');
    i += m[0].length;
    if (m[1].length > 4300) err('too many digits');
    if (!m[2] && !m[3]) return BigInt(m[0]);
    const d = Number(m[0]); if (!Number.isFinite(d)) err('beyond double'); return new F(d);
  }
  function str() {
    i++; let s = '';
    for (;;) {
      const c = text[i++];
      if (c === undefined) err('eof in string');
      if (c === '"') break;
      if (c === '\\') {
        const e = text[i++];
        const map = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };
        if (e in map) s += map[e];
        else if (e === 'u') { s += String.fromCharCode(parseInt(text.slice(i, i + 4), 16)); i += 4; }
        else err('escape');
      } else if (c < ' ') err('control'); else s += c;
    }
    // lone surrogates refused
    for (let j = 0; j < s.length; j++) {
      const u = s.charCodeAt(j);
      if (u >= 0xd800 && u <= 0xdbff) { const n = s.charCodeAt(j + 1); if (n >= 0xdc00 && n <= 0xdfff) { j++; continue; } err('lone surrogate'); }
      if (u >= 0xdc00 && u <= 0xdfff) err('lone surrogate');
    }
    return s;
  }
  const v = val(0); ws(); if (i !== text.length) err('trailing'); return v;
}
// --- Python repr of a double
function pyFloat(d) {
  if (!Number.isFinite(d)) throw new Error('non-finite');
  if (d === 0) return Object.is(d, -0) ? '-0.0' : '0.0';
  const sign = d < 0 ? '-' : ''; const e = Math.abs(d).toExponential(); // shortest digits
  let [mant, ex] = e.split('e'); const digits = mant.replace('.', ''); const exp = parseInt(ex, 10);
  if (exp >= -4 && exp < 16) {
    let s;
    if (exp >= 0) { const ip = digits.padEnd(exp + 1, '0').slice(0, exp + 1); const fp = digits.slice(exp + 1) || '0'; s = `${ip}.${fp}`; }
    else s = `0.${'0'.repeat(-exp - 1)}${digits}`;
    return sign + s;
  }
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${m}e${exp < 0 ? '-' : '+'}${String(Math.abs(exp)).padStart(2, '0')}`;
}
function escStr(s) {
  let o = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (ch === '"') o += '\\"'; else if (ch === '\\') o += '\\\\';
    else if (c === 8) o += '\\b'; else if (c === 9) o += '\\t'; else if (c === 10) o += '\\n'; else if (c === 12) o += '\\f'; else if (c === 13) o += '\\r';
    else if (c < 0x20) o += '\\u' + c.toString(16).padStart(4, '0');
    else o += ch;
  }
  return o + '"';
}
const cpCmp = (a, b) => Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
function canon(v) {
  if (v === null) return 'null';
  if (v === true) return 'true'; if (v === false) return 'false';
  if (typeof v === 'bigint') return v.toString();
  if (v instanceof F) return pyFloat(v.v);
  if (typeof v === 'number') return Number.isInteger(v) ? String(v) : pyFloat(v);
  if (typeof v === 'string') return escStr(v);
  if (Array.isArray(v)) return '[' + v.map(canon).join(',') + ']';
  const entries = v instanceof Map ? [...v.entries()] : Object.entries(v);
  entries.sort((a, b) => cpCmp(a[0], b[0]));
  return '{' + entries.map(([k, x]) => escStr(k) + ':' + canon(x)).join(',') + '}';
}
const canonText = (t) => canon(parse(t));

// 1. canonical-json
{ const d = load('canonical-json.json');
  for (const c of d.cases) { const out = canonText(c.input_json); eq(`canon ${c.name}`, Buffer.from(out).toString('hex'), c.canonical_hex); eq(`canon sha ${c.name}`, sha(out), c.sha256); }
  for (const c of d.errors) { checks++; try { canonText(c.input_json); fails++; console.log('NOT REFUSED', c.name); } catch { /* refused */ } } }
// 2. effect ids
{ const d = load('effect-ids.json');
  for (const c of d.effect_ids) { const t = canon([c.idempotency_key, BigInt(c.subturn_index), c.call_id]); eq('eff canon', t, c.canonical); eq('eff id', 'eff_' + sha(t).slice(0, 32), c.effect_id); }
  for (const c of d.claimed_effect_ids) { const t = canon(['claim', c.idempotency_key, BigInt(c.subturn_index), c.tool_name, BigInt(c.occurrence)]); eq('claim canon', t, c.canonical); eq('claim id', 'eff_' + sha(t).slice(0, 32), c.effect_id); }
  const argDigest = (v) => {
    if (v === undefined || v === null && false) return sha('{}');
    let val = v;
    if (typeof v === 'string') {
      if (v === '') return sha('{}');
      try { val = parse(v); if (depthOf(val) > 201) throw new Error('deep'); canon(val); } catch { return sha(canon({ __raw__: v })); }
    }
    if (!(val instanceof Map) && !(val !== null && typeof val === 'object' && !Array.isArray(val) && !(val instanceof F))) val = { __value__: val };
    return sha(canon(val));
  };
  for (const c of d.arguments_digests) eq('args ' + c.arguments, argDigest(c.arguments), c.arguments_digest);
  for (const c of d.call_arguments_digests) {
    const call = c.call; const t = call.type;
    const field = t === 'custom_tool_call' ? 'input' : ['computer_call', 'local_shell_call', 'shell_call'].includes(t) ? 'action' : t === 'apply_patch_call' ? 'operation' : 'arguments';
    // values that are not text are taken as given; parse them via the raw JSON so numbers stay exact
    let v = call[field];
    if (v !== undefined && typeof v !== 'string') v = parse(JSON.stringify(v)); // NB: loses 1.0 vs 1 for non-text values
    eq('call args ' + JSON.stringify(call).slice(0, 80), argDigest(v), c.arguments_digest);
  }
}
function depthOf(v) { if (Array.isArray(v)) return 1 + Math.max(0, ...v.map(depthOf)); if (v instanceof Map) return 1 + Math.max(0, ...[...v.values()].map(depthOf)); return 0; }
// 3. fingerprints
{ const d = load('fingerprints.json');
  const names = ['fingerprint_version','model_name','model_weights_revision','tokenizer_name','tokenizer_revision','renderer_name','renderer_version','chat_template_digest','chat_template_args','reasoning_parser','reasoning_flags','tool_parser','instructions_digest','tools_digest','lora_name','lora_revision','multimodal_input_digests','cache_salt_digest','block_hash_format','router_key_format','block_size','item_format_version'];
  for (const c of d.cases) {
    const o = {}; for (const n of names) o[n] = c.fingerprint[n] === undefined ? null : c.fingerprint[n];
    const t = canon(o); eq('fp canon ' + c.name, t, c.canonical); eq('fp hash ' + c.name, sha(t), c.fingerprint_hash);
    checks++; if (Object.keys(c.fingerprint).length !== 22) { fails++; console.log('fingerprint case has', Object.keys(c.fingerprint).length, 'fields'); }
  }
  const r = d.component_recipes;
  for (const c of r.instructions_digest) eq('instr', sha(Buffer.from(c.instructions, 'utf8')), c.digest);
  for (const c of r.chat_template_digest) eq('tmpl', sha(Buffer.from(c.chat_template, 'utf8')), c.digest);
  const secret = /^(headers|authorization|api_key|apikey|password|secret|token|access_token|refresh_token|client_secret|credentials|cookie|bearer)$|(_secret|_password|_api_key|_token|_credentials)$/i;
  const sanit = (v) => Array.isArray(v) ? v.map(sanit) : (v && typeof v === 'object') ? Object.fromEntries(Object.entries(v).filter(([k]) => !secret.test(k)).map(([k, x]) => [k, k === 'parameters' ? x : sanit(x)])) : v;
  for (const c of r.tools_digest) { const s = sanit(c.tools); eq('tools sanitized', canon(s), canon(c.sanitized)); eq('tools digest', sha(canon(s)), c.digest); }
  for (const c of r.cache_salt_digest) eq('salt', sha(Buffer.concat([Buffer.from('ratchet/cache_salt/v1'), Buffer.from([0]), Buffer.from(c.cache_salt, 'utf8')])), c.digest);
  for (const c of r.json_text_components) eq('json comp', canonText(c.input_json), c.component);
}
// 4. items
{ const d = load('items.json');
  for (const c of d.cases) {
    const t = canon(parse(JSON.stringify(c.object)));
    eq('item content ' + c.object.type, Buffer.from(t).toString('hex'), c.content_hex);
    eq('item digest ' + c.object.type, sha(t), c.content_digest);
    const o = c.object;
    const rec = { item_id: o.id, type: o.type, role: o.role ?? null, call_id: o.call_id ?? null, content: t, content_digest: sha(t), format_version: 1 };
    eq('item record ' + o.type, JSON.stringify(rec), JSON.stringify(c.item));
  } }
// 5. partition keys
{ const d = load('partition-keys.json');
  for (const c of d.cases) {
    const e = c.event; const key = e.conversation_id ?? e.chain_root_id ?? e.response_id;
    eq('pk ' + c.name, key, c.key); eq('pk hex', Buffer.from(key, 'utf8').toString('hex'), c.key_hex);
    const crc = zlib.crc32(Buffer.from(key, 'utf8')) >>> 0; eq('crc ' + c.name, crc, c.crc32); eq('part ' + c.name, crc % 12, c.partition_of_12);
  } }
// 6. request digests
{ const d = load('request-digests.json');
  for (const c of d.cases) { const t = canon(parse(JSON.stringify(c.request))); eq('req canon', t, c.canonical); eq('req digest', sha(t), c.request_digest); } }
console.log(`${checks - fails} of ${checks} checks reproduced; ${fails} mismatches`);
process.exit(fails ? 1 : 0);

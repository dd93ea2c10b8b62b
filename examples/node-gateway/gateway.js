'use strict';
// A minimal ratchet gateway, written from docs/gateway-protocol.md and CONTRACT.md alone.
// Sections named below are docs/gateway-protocol.md's.
const crypto = require('crypto');
const zlib = require('zlib');
const avro = require('avsc');
const { Kafka, logLevel } = require('kafkajs');
const { parse: losslessParse } = require('lossless-json');

const env = (k, d) => process.env[k] ?? d;
const PREFIX = env('RATCHET_TOPIC_PREFIX', 'ratchet.');
const BOOTSTRAP = env('RATCHET_KAFKA_BOOTSTRAP', '127.0.0.1:9092').split(',');
const REGISTRY = env('RATCHET_SCHEMA_REGISTRY_URL', 'http://127.0.0.1:8081/apis/ccompat/v7').replace(/\/$/, '');
const API = `http://${env('RATCHET_API_HOST', '127.0.0.1')}:${env('RATCHET_API_PORT', '8080')}`;
const MAX_VALUE = 10 * 1024 * 1024;

// ---- canonical JSON (section 3): keys by code point, Python's float spelling, exact integers
function cmpCodePoints(a, b) {
  const A = Array.from(a), B = Array.from(b);
  for (let i = 0; i < Math.min(A.length, B.length); i++) {
    const x = A[i].codePointAt(0), y = B[i].codePointAt(0);
    if (x !== y) return x - y;
  }
  return A.length - B.length;
}
// a float the gateway built (1.0 is not 1): wrap it as new Float(1)
class Float { constructor(value) { this.value = value; } }
// Python's repr of a double: shortest round-trip digits, fixed for exponents in [-4, 16)
function pyRepr(x) {
  if (!Number.isFinite(x)) throw new Error('NaN/Infinity has no canonical form');
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const [mant, e] = Math.abs(x).toExponential().split('e');
  const exp = Number(e); const digits = mant.replace('.', '');
  const sign = x < 0 ? '-' : '';
  if (exp >= -4 && exp < 16) {
    let s;
    if (exp >= 0) {
      const intPart = digits.length > exp + 1 ? digits.slice(0, exp + 1) : digits.padEnd(exp + 1, '0');
      const frac = digits.length > exp + 1 ? digits.slice(exp + 1) : '0';
      s = intPart + '.' + frac;
    } else s = '0.' + '0'.repeat(-exp - 1) + digits;
    return sign + s;
  }
  const m = digits.length > 1 ? digits[0] + '.' + digits.slice(1) : digits;
  return sign + m + 'e' + (exp < 0 ? '-' : '+') + String(Math.abs(exp)).padStart(2, '0');
}
function canonical(v) {
  if (v === null) return 'null';
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (v instanceof Float) return pyRepr(v.value);
  if (typeof v === 'number') {
    if (Number.isInteger(v) && !Number.isSafeInteger(v)) throw new Error(`refusing to digest an inexact integer ${v}`);
    return Number.isInteger(v) ? String(v) : pyRepr(v); // a non-integer JS number is a float
  }
  if (typeof v === 'bigint') return v.toString();
  if (typeof v === 'string') {
    if (/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(v)) throw new Error('lone surrogate');
    return JSON.stringify(v);
  }
  if (Array.isArray(v)) return '[' + v.map(canonical).join(',') + ']';
  if (typeof v === 'object') {
    return '{' + Object.keys(v).sort(cmpCodePoints).map((k) => canonical(k) + ':' + canonical(v[k])).join(',') + '}';
  }
  throw new Error(`cannot canonicalise ${typeof v}`);
}
// JSON text -> values canonical() writes as Python does: integers exact (BigInt), other
// numbers Float (JSON.parse would make 1.0 into 1 and round big integers); refuses NaN,
// Infinity, a key twice in one object, numbers beyond a double and integers of > 4300 digits
function parseExact(text) {
  return losslessParse(text, null, (num) => {
    const digits = num.replace(/^-/, '').split(/[.eE]/)[0];
    if (digits.length > 4300) throw new Error(`number of more than 4300 digits`);
    if (/^-?\d+$/.test(num)) return BigInt(num);
    const x = Number(num);
    if (!Number.isFinite(x)) throw new Error(`number ${num.slice(0, 20)} beyond a double`);
    return new Float(x);
  });
}
const sha256 = (x) => crypto.createHash('sha256').update(typeof x === 'string' ? Buffer.from(x, 'utf8') : x).digest('hex');

// ---- partition key (section 1)
function partitionKey(ev) {
  return ev.conversation_id ?? ev.chain_root_id ?? ev.response_id;
}
const crcPartitioner = () => ({ partitionMetadata, message }) => {
  if (Number.isInteger(message.partition)) return message.partition; // kafkajs asks even then
  if (message.key == null) throw new Error('a gateway event needs its partition key as Kafka key');
  return (zlib.crc32(Buffer.from(message.key)) >>> 0) % partitionMetadata.length;
};

// ---- items (section 5)
function item(obj) {
  if (typeof obj.type !== 'string') throw new Error('item without type');
  if (typeof obj.id !== 'string' || !obj.id) throw new Error('item without id');
  for (const f of ['role', 'call_id']) {
    if (obj[f] != null && typeof obj[f] !== 'string') throw new Error(`item ${f} not a string`); // ratchet: CORRUPT
  }
  const content = canonical(obj);
  return {
    item_id: obj.id, type: obj.type, role: obj.role ?? null, call_id: obj.call_id ?? null,
    content: Buffer.from(content, 'utf8'), content_digest: sha256(content), format_version: 1,
  };
}
// arguments_digest of a call item (section 4)
const ARG_FIELD = { custom_tool_call: 'input', computer_call: 'action', local_shell_call: 'action', shell_call: 'action', apply_patch_call: 'operation' };
function depthOk(v, d = 1) {
  if (v === null || typeof v !== 'object' || v instanceof Float) return true;
  const kids = Array.isArray(v) ? v : Object.values(v);
  if (d === 201) return kids.length === 0;
  return kids.every((k) => depthOk(k, d + 1));
}
function argumentsDigest(call) {
  let v = call[ARG_FIELD[call.type] ?? 'arguments'];
  if (v === undefined || v === '') v = {}; // missing or empty
  else if (typeof v === 'string') {
    const text = v;
    try { v = parseExact(text); canonical(v); if (!depthOk(v)) throw new Error('too deep'); } catch { v = { __raw__: text }; }
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v) || v instanceof Float) v = { __value__: v };
  return sha256(canonical(v));
}
const effectId = (key, subturn, callId) => 'eff_' + sha256(canonical([key, subturn, callId])).slice(0, 32);
const claimedEffectId = (key, subturn, tool, occ) => 'eff_' + sha256(canonical(['claim', key, subturn, tool, occ])).slice(0, 32);

// ---- fingerprint (section 4)
const FP_FIELDS = ['fingerprint_version', 'model_name', 'model_weights_revision', 'tokenizer_name', 'tokenizer_revision',
  'renderer_name', 'renderer_version', 'chat_template_digest', 'chat_template_args', 'reasoning_parser', 'reasoning_flags',
  'tool_parser', 'instructions_digest', 'tools_digest', 'lora_name', 'lora_revision', 'multimodal_input_digests',
  'cache_salt_digest', 'block_hash_format', 'router_key_format', 'block_size', 'item_format_version'];
function fingerprintHash(fp) {
  const o = {};
  for (const f of FP_FIELDS) { if (!(f in fp)) throw new Error(`fingerprint lacks ${f}`); o[f] = fp[f]; }
  return sha256(canonical(o));
}

// ---- registry (section 2)
const byId = new Map();
const bySubject = new Map();
async function http(url, opts) {
  const r = await fetch(url, opts);
  const text = await r.text();
  let body = null; try { body = JSON.parse(text); } catch { body = text; }
  return { status: r.status, body, headers: r.headers };
}
async function schemaFor(record) {
  if (bySubject.has(record)) return bySubject.get(record);
  const r = await http(`${REGISTRY}/subjects/io.ratchet.${record}/versions/latest`);
  if (r.status !== 200) throw new Error(`registry: ${record}: ${r.status} ${JSON.stringify(r.body)}`);
  const s = { id: r.body.id, text: r.body.schema, sha256: sha256(r.body.schema), type: avro.Type.forSchema(JSON.parse(r.body.schema)) };
  bySubject.set(record, s); byId.set(s.id, s);
  return s;
}
async function schemaById(id) {
  if (byId.has(id)) return byId.get(id);
  const r = await http(`${REGISTRY}/schemas/ids/${id}`);
  if (r.status !== 200) throw new Error(`registry id ${id}: ${r.status}`);
  const s = { id, text: r.body.schema, type: avro.Type.forSchema(JSON.parse(r.body.schema)) };
  byId.set(id, s);
  return s;
}
function frame(id, body) {
  const h = Buffer.alloc(5); h.writeUInt8(0, 0); h.writeUInt32BE(id, 1);
  return Buffer.concat([h, body]);
}
async function encode(record, value) {
  const s = await schemaFor(record);
  return frame(s.id, s.type.toBuffer(value));
}
async function decode(buf) {
  if (!buf || buf.length < 5 || buf[0] !== 0) throw new Error('not confluent framed');
  const s = await schemaById(buf.readUInt32BE(1));
  return s.type.fromBuffer(buf.subarray(5));
}

// ---- Kafka
const kafka = new Kafka({ clientId: 'node-gateway', brokers: BOOTSTRAP, logLevel: logLevel.NOTHING });
let producer;
async function connect() {
  producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false, createPartitioner: crcPartitioner });
  await producer.connect();
  const admin = kafka.admin(); await admin.connect();
  const topics = await admin.listTopics(); await admin.disconnect();
  if (!topics.includes(PREFIX + 'gateway-events')) throw new Error(`topic ${PREFIX}gateway-events missing`);
}
async function produceRaw(key, value) {
  const [md] = await producer.send({ topic: PREFIX + 'gateway-events', acks: -1, messages: [{ key, value }] });
  return { partition: md.partition, offset: md.baseOffset };
}
async function produce(record, ev) {
  const value = await encode(record, ev);
  if (value.length > MAX_VALUE) { const e = new Error(`event of ${value.length} bytes above ${MAX_VALUE}`); e.code = 'SIZE'; throw e; }
  return produceRaw(Buffer.from(partitionKey(ev), 'utf8'), value);
}

// outcome consumer: collects everything from the four outcome topics from now on
const outcomes = [];
async function consumeOutcomes(groupId) {
  const c = kafka.consumer({ groupId, maxBytes: 32 * 1024 * 1024 });
  const joined = new Promise((res) => { c.on(c.events.GROUP_JOIN, () => res()); });
  await c.connect();
  for (const t of ['checkpoints', 'rejections', 'orphaned-effects', 'dead-letters']) await c.subscribe({ topic: PREFIX + t, fromBeginning: false });
  await c.run({ eachMessage: async ({ topic, partition, message }) => {
    let v; try { v = await decode(message.value); } catch (e) { v = { undecodable: String(e) }; }
    outcomes.push({ topic: topic.slice(PREFIX.length), partition, offset: message.offset, key: message.key && message.key.toString(), value: v });
  } });
  await joined;
  return c;
}
async function waitOutcome(pred, ms = 20000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    const o = outcomes.find(pred); if (o) return o;
    await new Promise((r) => setTimeout(r, 100));
  }
  return null;
}

// ---- HTTP API (section 8)
const q = (o) => new URLSearchParams(Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined && v !== null))).toString();
const api = {
  history: (rid, p) => http(`${API}/v1/responses/${encodeURIComponent(rid)}/history?${q(p)}`),
  conversation: (cid, p) => http(`${API}/v1/conversations/${encodeURIComponent(cid)}/history?${q(p)}`),
  status: (rid, p) => http(`${API}/v1/responses/${encodeURIComponent(rid)}/status?${q(p)}`),
  claim: (b) => http(`${API}/v1/effects/claims`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(b) }),
  complete: (eid, b) => http(`${API}/v1/effects/claims/${eid}/complete`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(b) }),
  healthz: () => http(`${API}/healthz`),
};

module.exports = { argumentsDigest, Float, pyRepr, parseExact, canonical, sha256, partitionKey, item, effectId, claimedEffectId, fingerprintHash, schemaFor, schemaById, frame, encode, decode,
  connect, produce, produceRaw, consumeOutcomes, waitOutcome, outcomes, api, kafka, PREFIX, REGISTRY, MAX_VALUE, http, get producer() { return producer; } };

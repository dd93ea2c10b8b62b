'use strict';
// Drives a running ratchet worker + API through the documented outcomes
// (docs/gateway-protocol.md); every check names the outcome it expects.
const crypto = require('crypto');
const gw = require('./gateway');
const { item, sha256, canonical } = gw;

const RUN = crypto.randomBytes(4).toString('hex');
const T = `ten_${RUN}`;
const uuid = () => crypto.randomUUID();
const FP = {
  fingerprint_version: 1, model_name: 'openai/gpt-oss-20b', model_weights_revision: '6cee5e81ee83917806bbde320786a8fb61efebee',
  tokenizer_name: 'openai/gpt-oss-20b', tokenizer_revision: '6cee5e81ee83917806bbde320786a8fb61efebee', renderer_name: 'harmony',
  renderer_version: '0.0.4', chat_template_digest: sha256('{{ messages }}'), chat_template_args: '{}', reasoning_parser: null,
  reasoning_flags: '{}', tool_parser: 'openai', instructions_digest: sha256(''), tools_digest: sha256(canonical([])),
  lora_name: null, lora_revision: null, multimodal_input_digests: [], cache_salt_digest: null,
  block_hash_format: 'sha256-cbor-v1', router_key_format: 'prefix-blocks-v1', block_size: 16, item_format_version: 1,
};
const FPH = gw.fingerprintHash(FP);
const HOUR = 3600 * 1000;

function msg(id, role, text) {
  return item({ id, type: 'message', role, content: [{ type: role === 'user' ? 'input_text' : 'output_text', text, ...(role === 'user' ? {} : { annotations: [] }) }], ...(role === 'user' ? {} : { status: 'completed' }) });
}
function turn(o) {
  const now = Date.now();
  const art = o.artifact === false ? null : { artifact_id: `art_${uuid()}`, token_hash: sha256('toks' + o.response_id), token_count: 200, safe_append_boundary: 200, fingerprint_hash: FPH, expires_at: now + HOUR };
  const proof = art ? { prefix_hash: sha256('p'), prefix_count: 120, append_hash: sha256('a'), append_count: 80, combined_hash: art.token_hash, combined_count: 200, boundary_kind: 'message_end', fingerprint_hash: FPH, expires_at: now + HOUR } : null;
  const request = o.request ?? { model: 'openai/gpt-oss-20b', input: o.response_id };
  return {
    event_id: uuid(), tenant_id: o.tenant_id ?? T, conversation_id: o.conversation_id ?? null, chain_root_id: o.chain_root_id ?? null,
    response_id: o.response_id, produced_at: now, idempotency_key: o.idempotency_key ?? `idem_${o.response_id}`,
    request_digest: o.request_digest ?? sha256(canonical(request)), attempt: o.attempt ?? 1,
    previous_response_id: o.previous_response_id ?? null, expected_head_seq: o.expected_head_seq ?? null,
    status: o.status ?? 'completed', incomplete_reason: null,
    input_items: o.input_items ?? [msg(`${o.response_id}:in:0`, 'user', 'hi ' + o.response_id)],
    output_items: o.output_items ?? [msg(`${o.response_id}:out:0`, 'assistant', 'hello ' + o.response_id)],
    effective_config: { instructions_digest: FP.instructions_digest, tools_digest: FP.tools_digest, tool_choice: 'auto', truncation: o.truncation ?? 'disabled', truncated: o.truncated ?? false },
    fingerprint: FP, fingerprint_hash: FPH, boundary_proof: proof, token_artifact: art, router_receipt: null,
    subturns: o.subturns ?? [], tool_effect_ids: o.tool_effect_ids ?? [], stream: { streamed: false, client_disconnected: false },
    expires_at: o.expires_at ?? null, gateway_id: 'node-gateway',
  };
}

let pass = 0, fail = 0;
const findings = [];
function expect(name, cond, info) {
  if (cond) { pass++; console.log('  ok  ', name); } else { fail++; console.log('  FAIL', name, info !== undefined ? JSON.stringify(info).slice(0, 600) : ''); findings.push(name); }
}
const hist = (rid, extra = {}) => gw.api.history(rid, { tenant_id: T, fingerprint_hash: FPH, ...extra });
const status = (rid, tenant = T) => gw.api.status(rid, { tenant_id: tenant });
const rejection = (ev) => gw.waitOutcome((o) => o.topic === 'rejections' && o.value.event_id && o.value.response_id === ev.response_id && o.value.tenant_id === ev.tenant_id && o.value.idempotency_key === ev.idempotency_key && o.value.attempt === ev.attempt);
const deadLetter = (pos) => gw.waitOutcome((o) => o.topic === 'dead-letters' && o.value.source_partition === pos.partition && String(o.value.source_offset) === String(pos.offset));
async function sendAndWait(ev, record = 'TurnCompleted') {
  const pos = await gw.produce(record, ev);
  return { pos, r: await hist(ev.response_id, { wait_ms: 10000, partition_key: gw.partitionKey(ev) }) };
}

async function main() {
  await gw.connect();
  const consumer = await gw.consumeOutcomes(`node-gateway-smoke-${RUN}`);
  console.log('run', RUN, 'tenant', T, 'fingerprint', FPH);
  const h = await gw.api.healthz();
  expect('healthz 200 ok', h.status === 200 && h.body.notifier === true, h.body);

  // 1. Conversation: a new turn, certified
  const C = `conv_${RUN}`;
  const t1 = turn({ conversation_id: C, response_id: `resp_${RUN}_1`, expected_head_seq: 0 });
  let { r } = await sendAndWait(t1);
  expect('conv turn 1 certified', r.status === 200 && r.body.outcome === 'certified' && r.body.head_seq === 1 && r.body.items.length === 2, r.body);
  expect('items served byte-exact', r.body.items && r.body.items[0].content === t1.input_items[0].content.toString() && sha256(r.body.items[1].content) === r.body.items[1].content_digest);
  const cp1 = await gw.waitOutcome((o) => o.topic === 'checkpoints' && o.value.response_id === t1.response_id);
  expect('CheckpointPromoted published seq 1 certified', cp1 && cp1.value.seq === 1 && cp1.value.certification === 'certified' && cp1.key === C, cp1 && cp1.value);
  r = await hist(t1.response_id, { fingerprint_hash: sha256('other') });
  expect('other fingerprint -> fallback FINGERPRINT_MISMATCH with items', r.status === 200 && r.body.outcome === 'fallback' && r.body.reason === 'FINGERPRINT_MISMATCH' && r.body.items.length === 2, r.body);

  // 2. Turn 2 with a tool effect (function_call + output), at head 1
  const key2 = `idem_${RUN}_2`;
  const eff = gw.effectId(key2, 0, 'call_1');
  const fco = item({ id: 'fco_1', type: 'function_call_output', call_id: 'call_1', output: '{"temp_c":21}' });
  const te = { event_id: uuid(), tenant_id: T, conversation_id: C, chain_root_id: null, response_id: `resp_${RUN}_2`, produced_at: Date.now(), effect_id: eff,
    idempotency_key: key2, attempt: 1, subturn_index: 0, call_id: 'call_1', tool_name: 'get_weather', arguments_digest: sha256(canonical({ city: 'Paris' })), status: 'succeeded', output: fco, executed_at: Date.now() };
  await gw.produce('ToolEffect', te);
  const t2 = turn({ conversation_id: C, response_id: `resp_${RUN}_2`, expected_head_seq: 1, idempotency_key: key2,
    output_items: [item({ id: 'fc_1', type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}', status: 'completed' }), fco, msg('m2', 'assistant', '21 C')],
    subturns: [{ index: 0, ephemeral_artifact_ref: 'eph_1', effect_ids: [eff] }], tool_effect_ids: [eff] });
  ({ r } = await sendAndWait(t2));
  const cp2a = await gw.waitOutcome((o) => o.topic === 'checkpoints' && o.value.response_id === t2.response_id);
  expect('conv turn 2 with tool effect certified, complete history (6 items)', r.status === 200 && r.body.outcome === 'certified' && r.body.head_seq === 2 && r.body.items.length === 6 && r.body.conversation_head_seq === 2, r.body);
  r = await gw.api.conversation(C, { tenant_id: T, fingerprint_hash: FPH });
  expect('conversation endpoint head 2', r.status === 200 && r.body.head_seq === 2 && r.body.items.length === 6 && r.body.response_id === t2.response_id, r.body);

  // 3. retry of a promoted request: same id -> same promotion; other id -> DUPLICATE
  const t2b = { ...t2, event_id: uuid(), attempt: 2 };
  await gw.produce('TurnCompleted', t2b);
  const cp2b = await gw.waitOutcome((o) => o.topic === 'checkpoints' && o.value.response_id === t2.response_id && o.value.event_id !== cp2a.value.event_id);
  expect('retry same response id re-emits promotion (seq 2, attempt 1)', cp2b && cp2b.value.seq === 2 && cp2b.value.attempt === 1, cp2b && cp2b.value);
  const t2c = { ...t2, event_id: uuid(), attempt: 3, response_id: `resp_${RUN}_2dup`, expected_head_seq: 2 };
  await gw.produce('TurnCompleted', t2c);
  let rj = await rejection(t2c);
  expect('retry under another response id -> DUPLICATE naming original', rj && rj.value.reason === 'DUPLICATE' && rj.value.existing_response_id === t2.response_id && rj.value.head_seq === 2, rj && rj.value);
  r = await status(t2c.response_id);
  expect('status of DUPLICATE: rejected + existing_response_id', r.body.state === 'rejected' && r.body.reason === 'DUPLICATE' && r.body.existing_response_id === t2.response_id, r.body);

  // 4. same key, other digest -> IDEMPOTENCY_KEY_REUSED
  const t2d = { ...t2c, event_id: uuid(), response_id: `resp_${RUN}_2reuse`, request_digest: sha256('other request'), attempt: 4 };
  await gw.produce('TurnCompleted', t2d);
  rj = await rejection(t2d);
  expect('same key other digest -> IDEMPOTENCY_KEY_REUSED', rj && rj.value.reason === 'IDEMPOTENCY_KEY_REUSED' && rj.value.existing_response_id === t2.response_id, rj && rj.value);

  // 5. head ordering
  const t3x = turn({ conversation_id: C, response_id: `resp_${RUN}_3x`, expected_head_seq: 5 });
  ({ r } = await sendAndWait(t3x));
  rj = await rejection(t3x);
  expect('expected_head_seq > head -> OUT_OF_ORDER with head_seq 2, 409', r.status === 409 && rj && rj.value.reason === 'OUT_OF_ORDER' && rj.value.head_seq === 2, [r.body, rj && rj.value]);
  const t3y = turn({ conversation_id: C, response_id: `resp_${RUN}_3y`, expected_head_seq: 1 });
  await gw.produce('TurnCompleted', t3y); rj = await rejection(t3y);
  expect('expected_head_seq < head -> CONFLICT, existing_response_id null', rj && rj.value.reason === 'CONFLICT' && rj.value.head_seq === 2 && rj.value.existing_response_id === null, rj && rj.value);

  // 6. NO_ARTIFACT and NOT_CERTIFIED, truncation
  const t3 = turn({ conversation_id: C, response_id: `resp_${RUN}_3`, expected_head_seq: 2, artifact: false });
  ({ r } = await sendAndWait(t3));
  expect('completed without artifact -> fallback NO_ARTIFACT, checkpoint null', r.status === 200 && r.body.outcome === 'fallback' && r.body.reason === 'NO_ARTIFACT' && r.body.checkpoint === null && r.body.items.length === 8, r.body);
  const t4 = turn({ conversation_id: C, response_id: `resp_${RUN}_4`, expected_head_seq: 3, truncation: 'auto', truncated: true });
  ({ r } = await sendAndWait(t4));
  expect('truncated -> fallback NOT_CERTIFIED', r.status === 200 && r.body.outcome === 'fallback' && r.body.reason === 'NOT_CERTIFIED', r.body);
  const t5 = turn({ conversation_id: C, response_id: `resp_${RUN}_5`, expected_head_seq: 4, status: 'incomplete' });
  ({ r } = await sendAndWait(t5));
  const cp5 = await gw.waitOutcome((o) => o.topic === 'checkpoints' && o.value.response_id === t5.response_id);
  expect('incomplete -> logical_only, NOT_CERTIFIED', r.body.reason === 'NOT_CERTIFIED' && cp5 && cp5.value.certification === 'logical_only', [r.body, cp5 && cp5.value]);
  const t6f = turn({ conversation_id: C, response_id: `resp_${RUN}_6f`, expected_head_seq: 5, status: 'failed' });
  ({ r } = await sendAndWait(t6f)); rj = await rejection(t6f);
  expect('failed -> NOT_PROMOTABLE_STATUS, 409', r.status === 409 && rj && rj.value.reason === 'NOT_PROMOTABLE_STATUS', [r.body, rj && rj.value]);

  // 7. cancellation before completion
  const k7 = `idem_${RUN}_7`;
  const can = { event_id: uuid(), tenant_id: T, conversation_id: C, chain_root_id: null, response_id: `resp_${RUN}_7`, produced_at: Date.now(), idempotency_key: k7, cancelled_at: Date.now() };
  await gw.produce('TurnCancelled', can);
  const t7 = turn({ conversation_id: C, response_id: `resp_${RUN}_7`, expected_head_seq: 5, idempotency_key: k7 });
  ({ r } = await sendAndWait(t7)); rj = await rejection(t7);
  expect('cancelled request -> CANCELLED', rj && rj.value.reason === 'CANCELLED' && r.status === 409, [r.body, rj && rj.value]);

  // 8. MISSING_TOOL_EFFECT
  const t8 = turn({ conversation_id: C, response_id: `resp_${RUN}_8`, expected_head_seq: 5, tool_effect_ids: [gw.effectId('nope', 0, 'c')] });
  await gw.produce('TurnCompleted', t8); rj = await rejection(t8);
  expect('unrecorded effect id -> MISSING_TOOL_EFFECT', rj && rj.value.reason === 'MISSING_TOOL_EFFECT', rj && rj.value);

  // 9. item catalogue
  const t9 = turn({ conversation_id: C, response_id: `resp_${RUN}_9`, expected_head_seq: 5, output_items: [item({ id: 'h1', type: 'hologram_call' })] });
  await gw.produce('TurnCompleted', t9); rj = await rejection(t9);
  expect('unknown item type -> UNKNOWN_ITEM_TYPE', rj && rj.value.reason === 'UNKNOWN_ITEM_TYPE', rj && rj.value);
  const bad = msg('m10', 'assistant', 'x'); bad.content_digest = sha256('nope');
  const t10 = turn({ conversation_id: C, response_id: `resp_${RUN}_10`, expected_head_seq: 5, output_items: [bad] });
  await gw.produce('TurnCompleted', t10); rj = await rejection(t10);
  expect('bad content digest -> CORRUPT', rj && rj.value.reason === 'CORRUPT', rj && rj.value);
  const t11 = turn({ conversation_id: C, response_id: `resp_${RUN}_11`, expected_head_seq: 5, output_items: [msg('m11', 'assistant', 'x'), item({ id: 'rs_11', type: 'reasoning', summary: [] })] });
  await gw.produce('TurnCompleted', t11); rj = await rejection(t11);
  expect('reasoning last -> UNPAIRED_TOOL_CALL', rj && rj.value.reason === 'UNPAIRED_TOOL_CALL', rj && rj.value);
  const t12 = turn({ conversation_id: C, response_id: `resp_${RUN}_12`, expected_head_seq: 5, output_items: [item({ id: 'fco_x', type: 'function_call_output', call_id: 'call_zz', output: 'x' })] });
  await gw.produce('TurnCompleted', t12); rj = await rejection(t12);
  expect('output without its call -> UNPAIRED_TOOL_CALL', rj && rj.value.reason === 'UNPAIRED_TOOL_CALL', rj && rj.value);
  const t13 = turn({ conversation_id: C, response_id: `resp_${RUN}_13`, expected_head_seq: 5, output_items: [
    item({ id: 'ws_1', type: 'web_search_call', status: 'completed', action: { type: 'search', query: 'x' } }),
    item({ id: 'mcpr_1', type: 'mcp_approval_request', server_label: 's', name: 'n', arguments: '{}' }),
    item({ id: 'mcpa_1', type: 'mcp_approval_response', approval_request_id: 'mcpr_1', approve: true }),
    item({ id: 'ctc_1', type: 'custom_tool_call', call_id: 'cc_1', name: 'grep', input: 'abc' }),
    item({ id: 'ctco_1', type: 'custom_tool_call_output', call_id: 'cc_1', output: 'found' }),
    msg('m13', 'assistant', 'done'),
    item({ id: 'fc_13', type: 'function_call', call_id: 'call_13', name: 'client_tool', arguments: '{}' })] });
  ({ r } = await sendAndWait(t13));
  expect('catalogue: web_search, mcp approval, custom tool, open client call at end -> promoted', r.status === 200 && r.body.head_seq === 6, r.body);

  // 10. response-id uniqueness
  const t14 = turn({ conversation_id: `conv_${RUN}_b`, response_id: t1.response_id, expected_head_seq: 0, idempotency_key: `idem_${RUN}_14` });
  await gw.produce('TurnCompleted', t14); rj = await rejection(t14);
  expect('response id bound to another request -> CONFLICT, existing_response_id = own id', rj && rj.value.reason === 'CONFLICT' && rj.value.existing_response_id === t1.response_id, rj && rj.value);

  // 11. chain mode
  const R1 = `resp_${RUN}_c1`;
  const c1 = turn({ response_id: R1 });
  ({ r } = await sendAndWait(c1));
  expect('chain root certified, seq 1', r.status === 200 && r.body.outcome === 'certified' && r.body.head_seq === 1 && r.body.conversation_head_seq === null, r.body);
  const c2 = turn({ response_id: `resp_${RUN}_c2`, previous_response_id: R1, chain_root_id: R1 });
  ({ r } = await sendAndWait(c2));
  expect('chain child certified, seq 2, 4 items', r.status === 200 && r.body.head_seq === 2 && r.body.items.length === 4, r.body);
  const c2b = turn({ response_id: `resp_${RUN}_c2b`, previous_response_id: R1, chain_root_id: R1 });
  ({ r } = await sendAndWait(c2b));
  expect('chain fork legal', r.status === 200 && r.body.head_seq === 2, r.body);
  const c3 = turn({ response_id: `resp_${RUN}_c3`, previous_response_id: `resp_${RUN}_nope`, chain_root_id: R1 });
  await gw.produce('TurnCompleted', c3); rj = await rejection(c3);
  expect('unknown parent -> PARENT_NOT_PROMOTED', rj && rj.value.reason === 'PARENT_NOT_PROMOTED', rj && rj.value);
  r = await gw.api.history(R1, { tenant_id: 'ten_other', fingerprint_hash: FPH });
  expect('another tenant -> 404 NOT_FOUND', r.status === 404 && r.body.reason === 'NOT_FOUND', r.body);
  r = await status('resp_never_' + RUN);
  expect('status unknown', r.status === 200 && r.body.state === 'unknown', r.body);
  r = await hist('resp_never_' + RUN, { wait_ms: 300 });
  expect('wait_ms on unknown -> 409 NOT_PROMOTED', r.status === 409 && r.body.reason === 'NOT_PROMOTED' && r.body.response_id === 'resp_never_' + RUN, r.body);

  // 12. expiry
  const e1 = turn({ response_id: `resp_${RUN}_e1`, expires_at: Date.now() - 1000 });
  ({ r } = await sendAndWait(e1));
  expect('expires_at past -> promoted, read 410 EXPIRED', r.status === 410 && r.body.reason === 'EXPIRED', r.body);
  r = await status(e1.response_id);
  expect('expired still promoted in status', r.body.state === 'promoted' && r.body.seq === 1, r.body);
  const e2 = turn({ response_id: `resp_${RUN}_e2`, previous_response_id: e1.response_id, chain_root_id: e1.response_id });
  ({ r } = await sendAndWait(e2));
  expect('child of expired served 200 with ancestor items', r.status === 200 && r.body.items.length === 4, r.body);

  // 13. size limit
  const big = 'x'.repeat(1024 * 1024);
  const many = Array.from({ length: 11 }, (_, i) => msg(`big_${i}`, 'assistant', big));
  const s1 = turn({ response_id: `resp_${RUN}_big`, output_items: many });
  let refused = null;
  try { await gw.produce('TurnCompleted', s1); } catch (e) { refused = e; }
  expect('gateway refuses > 10 MiB before producing', refused && refused.code === 'SIZE', String(refused));
  const value = await gw.encode('TurnCompleted', s1);
  const pos = await gw.produceRaw(Buffer.from(s1.response_id), value);
  rj = await rejection(s1);
  expect(`processor rejects ${value.length}-byte turn UNSUPPORTED_FORMAT`, rj && rj.value.reason === 'UNSUPPORTED_FORMAT', rj && rj.value);
  const eight = Array.from({ length: 8 }, (_, i) => msg(`eight_${i}`, 'assistant', 'y'.repeat(1024 * 1024 - 120)));
  const s2 = turn({ response_id: `resp_${RUN}_8mib`, output_items: eight });
  ({ r } = await sendAndWait(s2));
  expect('8 MiB of items travels end to end', r.status === 200 && r.body.outcome === 'certified' && r.body.items.length === 9, [r.status, r.body.reason, r.body.detail]);

  // the bound is exact: a value of 10,485,760 bytes (header + body) travels, one more byte is refused
  const sized = async (rid, target) => {
    const pad = (n) => turn({ response_id: rid, output_items: [...eight.slice(0, 9), msg(`${rid}_pad`, 'assistant', 'z'.repeat(n))] });
    let n = 1000; const base = (await gw.encode('TurnCompleted', pad(n))).length;
    n += target - base;  // then once more: the content's length prefix grew a byte or two
    n += target - (await gw.encode('TurnCompleted', pad(n))).length;
    const ev = pad(n); const v = await gw.encode('TurnCompleted', ev);
    return { ev, v };
  };
  const atMax = await sized(`resp_${RUN}_max`, gw.MAX_VALUE);
  expect('value of exactly 10,485,760 bytes built', atMax.v.length === gw.MAX_VALUE, atMax.v.length);
  await gw.produceRaw(Buffer.from(atMax.ev.response_id), atMax.v);
  r = await hist(atMax.ev.response_id, { wait_ms: 10000 });
  expect('a 10,485,760-byte turn is promoted', r.status === 200 && r.body.outcome === 'certified', [r.status, r.body.reason, r.body.detail]);
  const overMax = await sized(`resp_${RUN}_max1`, gw.MAX_VALUE + 1);
  await gw.produceRaw(Buffer.from(overMax.ev.response_id), overMax.v);
  rj = await rejection(overMax.ev);
  expect(`a ${overMax.v.length}-byte turn is UNSUPPORTED_FORMAT`, overMax.v.length === gw.MAX_VALUE + 1 && rj && rj.value.reason === 'UNSUPPORTED_FORMAT', [overMax.v.length, rj && rj.value]);

  // 14. dead letters
  let p = await gw.produceRaw(Buffer.from(`dl_${RUN}`), Buffer.from([1, 0, 0, 0, 1, 2, 3]));
  let dl = await deadLetter(p);
  expect('bad magic -> dead letter BAD_MAGIC_BYTE', dl && dl.value.reason === 'BAD_MAGIC_BYTE', dl && dl.value);
  const teBad = { ...te, event_id: uuid(), conversation_id: `conv_other_${RUN}` };
  p = await gw.produceRaw(Buffer.from(C), await gw.encode('ToolEffect', teBad));
  dl = await deadLetter(p);
  expect('ToolEffect keyed otherwise -> INVALID_EVENT', dl && dl.value.reason === 'INVALID_EVENT', dl && dl.value);

  // 15. effect claims
  const k15 = `idem_${RUN}_15`;
  const claimBody = { tenant_id: T, idempotency_key: k15, partition_key: C, attempt: 1, subturn_index: 0, tool_name: 'send_mail', occurrence: 0,
    arguments_digest: sha256(canonical({ to: 'a' })), call_id: 'call_m', token: uuid(), lease_ms: 60000, policy: 'at_most_once', response_id: `resp_${RUN}_15` };
  r = await gw.api.claim(claimBody);
  const ceid = gw.claimedEffectId(k15, 0, 'send_mail', 0);
  expect('claim -> CLAIMED with computed effect_id', r.status === 200 && r.body.state === 'CLAIMED' && r.body.effect_id === ceid, r.body);
  r = await gw.api.claim({ ...claimBody, token: uuid(), attempt: 2 });
  expect('second claimant -> IN_PROGRESS', r.body.state === 'IN_PROGRESS', r.body);
  const out = item({ id: 'fco_m', type: 'function_call_output', call_id: 'call_m', output: 'sent' });
  const outJson = { ...out, content: out.content.toString() };
  r = await gw.api.complete(ceid, { tenant_id: T, idempotency_key: k15, partition_key: C, token: claimBody.token, status: 'succeeded', output: outJson });
  expect('complete -> COMPLETED', r.status === 200 && r.body.state === 'COMPLETED', r.body);
  r = await gw.api.claim({ ...claimBody, token: uuid(), attempt: 2, call_id: 'call_m2' });
  expect('claim after completion -> COMPLETED with output', r.body.state === 'COMPLETED' && r.body.output && r.body.output.content === outJson.content, r.body);
  r = await gw.api.claim({ ...claimBody, token: uuid(), arguments_digest: sha256('x') });
  expect('other arguments -> CONFLICT', r.body.state === 'CONFLICT', r.body);
  // promote a turn that carries the claimed output
  const t15 = turn({ conversation_id: C, response_id: `resp_${RUN}_15`, expected_head_seq: 6, idempotency_key: k15,
    input_items: [item({ id: 'fco_13', type: 'function_call_output', call_id: 'call_13', output: 'client result' })],
    output_items: [item({ id: 'fc_m', type: 'function_call', call_id: 'call_m', name: 'send_mail', arguments: '{"to":"a"}' }), out, msg('m15', 'assistant', 'sent')],
    tool_effect_ids: [ceid] });
  ({ r } = await sendAndWait(t15));
  expect('turn using a completed claim certified at seq 7', r.status === 200 && r.body.head_seq === 7, r.body);
  r = await gw.api.claim({ ...claimBody, token: uuid(), occurrence: 1 });
  expect('claim of a promoted request -> PROMOTED', r.body.state === 'PROMOTED' && r.body.existing_response_id === t15.response_id, r.body);

  // 16. timestamps: years 1-9999 (docs/gateway-protocol.md section 6), any field
  const MAX_MS = 253402300799999, MIN_MS = -62135596800000;  // 9999-12-31T23:59:59.999Z, 0001-01-01T00:00:00.000Z
  const tsOk = turn({ response_id: `resp_${RUN}_ts_ok`, expires_at: MAX_MS });
  tsOk.produced_at = MIN_MS; tsOk.token_artifact.expires_at = MAX_MS;
  ({ r } = await sendAndWait(tsOk));
  expect('timestamps at both ends of years 1-9999 -> promoted, certified, artifact expiry served',
    r.status === 200 && r.body.outcome === 'certified' && Date.parse(r.body.checkpoint.expires_at) === MAX_MS, r.body);
  const outOfRange = [
    ['TurnCompleted produced_at after 9999', (ev) => { ev.produced_at = MAX_MS + 1; }],
    ['TurnCompleted produced_at before year 1', (ev) => { ev.produced_at = MIN_MS - 1; }],
    ['TurnCompleted expires_at after 9999', (ev) => { ev.expires_at = MAX_MS + 1; }],
    ['token_artifact.expires_at after 9999', (ev) => { ev.token_artifact.expires_at = MAX_MS + 1; }],
    ['boundary_proof.expires_at before year 1', (ev) => { ev.boundary_proof.expires_at = MIN_MS - 1; }],
    ['router_receipt.expires_at after 9999', (ev) => { ev.router_receipt = { receipt_id: 'rr', router_key_format: FP.router_key_format, covered_tokens: 16, expires_at: MAX_MS + 1, issuer: 'router' }; }],
  ];
  for (const [i, [what, spoil]] of outOfRange.entries()) {
    const ev = turn({ response_id: `resp_${RUN}_ts_${i}` }); spoil(ev);
    const pos = await gw.produce('TurnCompleted', ev);
    const d = await deadLetter(pos);
    expect(`${what} -> dead letter CORRUPT_PAYLOAD`, d && d.value.reason === 'CORRUPT_PAYLOAD', d && d.value);
  }
  r = await status(`resp_${RUN}_ts_0`);
  expect('a dead-lettered turn has no decision: status unknown', r.body.state === 'unknown', r.body);
  r = await hist(`resp_${RUN}_ts_0`, { wait_ms: 300 });
  expect('... and a wait_ms read ends 409 NOT_PROMOTED, no decision', r.status === 409 && r.body.reason === 'NOT_PROMOTED', r.body);
  p = await gw.produce('ToolEffect', { ...te, event_id: uuid(), executed_at: MAX_MS + 1 });
  dl = await deadLetter(p);
  expect('ToolEffect executed_at after 9999 -> CORRUPT_PAYLOAD', dl && dl.value.reason === 'CORRUPT_PAYLOAD', dl && dl.value);
  p = await gw.produce('TurnCancelled', { ...can, event_id: uuid(), idempotency_key: `idem_${RUN}_ts_can`, cancelled_at: MIN_MS - 1 });
  dl = await deadLetter(p);
  expect('TurnCancelled cancelled_at before year 1 -> CORRUPT_PAYLOAD', dl && dl.value.reason === 'CORRUPT_PAYLOAD', dl && dl.value);
  const ancient = turn({ response_id: `resp_${RUN}_ts_ancient`, expires_at: MIN_MS });
  ({ r } = await sendAndWait(ancient));
  expect('expires_at 0001-01-01 -> promoted, read 410 EXPIRED', r.status === 410 && r.body.reason === 'EXPIRED', r.body);

  // 17. artifacts that are not kept: certified, NO_ARTIFACT, CheckpointPromoted without artifact
  const noProof = turn({ response_id: `resp_${RUN}_noproof` }); noProof.boundary_proof = null;
  ({ r } = await sendAndWait(noProof));
  let cpx = await gw.waitOutcome((o) => o.topic === 'checkpoints' && o.value.response_id === noProof.response_id);
  expect('artifact without boundary proof -> certified, fallback NO_ARTIFACT, artifact_id null',
    r.body.reason === 'NO_ARTIFACT' && cpx && cpx.value.certification === 'certified' && cpx.value.artifact_id === null && cpx.value.artifact_expires_at === null, [r.body, cpx && cpx.value]);
  const stale = turn({ response_id: `resp_${RUN}_stale` }); stale.token_artifact.expires_at = Date.now() - 1000;
  ({ r } = await sendAndWait(stale));
  cpx = await gw.waitOutcome((o) => o.topic === 'checkpoints' && o.value.response_id === stale.response_id);
  expect('artifact expired before processing -> promoted, NO_ARTIFACT (not ARTIFACT_EXPIRED), artifact_id null',
    r.body.reason === 'NO_ARTIFACT' && cpx && cpx.value.artifact_id === null, [r.body, cpx && cpx.value]);
  const rcpt = turn({ response_id: `resp_${RUN}_rcpt` });
  rcpt.router_receipt = { receipt_id: 'rr', router_key_format: FP.router_key_format, covered_tokens: 16, expires_at: Date.now() - 1000, issuer: 'router' };
  ({ r } = await sendAndWait(rcpt));
  expect('router receipt expired before processing -> ARTIFACT_EXPIRED', r.body.outcome === 'fallback' && r.body.reason === 'ARTIFACT_EXPIRED', r.body);

  // 18. head_seq of an older Conversation response, and the Conversation's head beside it
  r = await hist(t1.response_id);
  expect('older Conversation response: head_seq its own seq (1), conversation_head_seq the head (7)',
    r.status === 200 && r.body.head_seq === 1 && r.body.conversation_head_seq === 7 && r.body.items.length === 2, r.body);

  // 19. a chain retry of a promoted request whose parent is absent: the promotion that stands
  const cpc2 = await gw.waitOutcome((o) => o.topic === 'checkpoints' && o.value.response_id === c2.response_id);
  const c2r = { ...c2, event_id: uuid(), attempt: 2, previous_response_id: `resp_${RUN}_absent` };
  await gw.produce('TurnCompleted', c2r);
  cpx = await gw.waitOutcome((o) => o.topic === 'checkpoints' && o.value.response_id === c2.response_id && o.value.event_id !== cpc2.value.event_id);
  expect('chain retry, same response id, absent parent -> the standing promotion (seq 2, attempt 1)',
    cpx && cpx.value.seq === 2 && cpx.value.attempt === 1, cpx && cpx.value);
  const c2d = { ...c2, event_id: uuid(), attempt: 3, response_id: `resp_${RUN}_c2d`, previous_response_id: `resp_${RUN}_absent`,
    output_items: [item({ id: 'fco_c2d', type: 'function_call_output', call_id: 'call_none', output: 'x' })] };
  await gw.produce('TurnCompleted', c2d); rj = await rejection(c2d);
  expect('chain retry, other response id, absent parent, unpaired items -> DUPLICATE naming the original',
    rj && rj.value.reason === 'DUPLICATE' && rj.value.existing_response_id === c2.response_id && rj.value.head_seq === 2, rj && rj.value);
  const c2k = { ...c2d, event_id: uuid(), attempt: 4, response_id: `resp_${RUN}_c2k`, request_digest: sha256('another request') };
  await gw.produce('TurnCompleted', c2k); rj = await rejection(c2k);
  expect('... with another request digest -> IDEMPOTENCY_KEY_REUSED', rj && rj.value.reason === 'IDEMPOTENCY_KEY_REUSED' && rj.value.existing_response_id === c2.response_id, rj && rj.value);

  // 20. response ids are per tenant: another tenant's chain may reuse R1 (same Kafka key)
  const T2 = `ten2_${RUN}`;
  const o1 = turn({ response_id: R1, tenant_id: T2, idempotency_key: `idem_${RUN}_t2`, input_items: [msg(`${R1}:in:0`, 'user', 'tenant two')] });
  await gw.produce('TurnCompleted', o1);
  r = await gw.api.history(R1, { tenant_id: T2, fingerprint_hash: FPH, wait_ms: 10000 });
  const mine = await hist(R1);
  expect('another tenant promotes the same response id as its own chain root; each reads its own',
    r.status === 200 && r.body.head_seq === 1 && r.body.items[0].content === o1.input_items[0].content.toString()
    && mine.status === 200 && mine.body.items[0].content === c1.input_items[0].content.toString() && mine.body.items[0].content !== r.body.items[0].content, [r.body, mine.body]);

  console.log(`\n${pass} passed, ${fail} failed`);
  if (findings.length) console.log('failed:', findings.join('; '));
  await consumer.disconnect(); await gw.producer.disconnect();
  process.exit(fail ? 1 : 0);
}
main().catch((e) => { console.error(e); process.exit(2); });

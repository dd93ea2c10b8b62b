import fs from 'node:fs'; import crypto from 'node:crypto';
// The registry's schema text of a gateway event, from schemas/*.avsc (docs/gateway-protocol.md, section 2).
export function schemaTexts(dir) {
const files = Object.fromEntries(fs.readdirSync(dir).filter(f => f.endsWith('.avsc')).map(f => { const j = JSON.parse(fs.readFileSync(`${dir}/${f}`, 'utf8')); return [`${j.namespace}.${j.name}`, j]; }));
function inline(rec) {
  const seen = new Set([`${rec.namespace}.${rec.name}`]);
  const walk = (t) => {
    if (typeof t === 'string') { const full = t.includes('.') ? t : `io.ratchet.${t}`; if (files[full] && !seen.has(full)) { seen.add(full); return walk(structuredClone(files[full])); } return t; }
    if (Array.isArray(t)) return t.map(walk);
    if (t && typeof t === 'object') {
      const o = {}; for (const [k, v] of Object.entries(t)) o[k] = (k === 'type' || k === 'items' || k === 'values' || k === 'fields') ? (k === 'fields' ? v.map(f => ({ ...Object.fromEntries(Object.entries(f).map(([fk, fv]) => [fk, fk === 'type' ? walk(fv) : fv])) })) : walk(v)) : v;
      return o;
    }
    return t;
  };
  return walk(structuredClone(rec));
}
return Object.fromEntries(['TurnCompleted', 'ToolEffect', 'TurnCancelled'].map((r) => [r, JSON.stringify(inline(files[`io.ratchet.${r}`]))]));
}
export const sha256 = (t) => crypto.createHash('sha256').update(t).digest('hex');

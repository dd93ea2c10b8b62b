package main

import (
	"fmt"
	"strings"
	"time"
)

const tenant = "gotenant"

func items(a Answer) []any {
	if v, ok := a.Body["items"].([]any); ok {
		return v
	}
	return nil
}

var scenarios = []scenario{
	{"conversation: certify, continue, fallbacks, retries", func(r runner) {
		g := r.g
		conv := NewID("conv_go_")
		t1 := Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 0, Text: "hello", Artifact: true}
		e1 := t1.Build()
		r.send(e1)
		cp := r.promoted("turn 1", e1)
		if cp == nil {
			return
		}
		check("turn 1 seq 1, certified, 2 items", fmt.Sprintf("%v %v %v", cp["seq"], cp["certification"], cp["item_count"]) == "1 certified 2", cp)
		check("turn 1 partition_key is the conversation", cp["partition_key"] == conv, cp["partition_key"])
		h := g.ResponseHistory(tenant, e1.ResponseID, fpHash, 0)
		check("history certified 200", h.Code == 200 && h.S("outcome") == "certified", h.Code, h.Raw)
		check("history head_seq 1, conversation_head_seq 1", h.S("head_seq") == "1" && h.S("conversation_head_seq") == "1", h.Raw)
		its := items(h)
		check("history holds the 2 items byte-exact", len(its) == 2 && its[0].(map[string]any)["content"] == string(e1.InputItems[0].Content), h.Raw)
		ck, _ := h.Body["checkpoint"].(map[string]any)
		check("checkpoint carries the artifact", ck != nil && ck["token_artifact"] != nil && ck["fingerprint_hash"] == fpHash, h.Raw)
		if ck != nil {
			ta, _ := ck["token_artifact"].(map[string]any)
			check("checkpoint.expires_at ends in Z, token_artifact.expires_at in +00:00",
				strings.HasSuffix(fmt.Sprint(ck["expires_at"]), "Z") && ta != nil && strings.HasSuffix(fmt.Sprint(ta["expires_at"]), "+00:00"), ck)
		}
		hz := g.do("GET", "/healthz", nil, nil)
		check("healthz 200 ok with its notifier", hz.Code == 200 && hz.S("status") == "ok" && hz.S("notifier") == "true", hz.Raw)
		bad := g.ResponseHistory(tenant, e1.ResponseID, fpHash, 10001)
		check("wait_ms 10001: 422 INVALID_REQUEST", bad.Code == 422 && bad.S("error") == "INVALID_REQUEST", bad.Raw)
		other := Sha256Hex([]byte("another fingerprint"))
		h = g.ResponseHistory(tenant, e1.ResponseID, other, 0)
		check("another fingerprint: fallback FINGERPRINT_MISMATCH with every item", h.Code == 200 && h.S("outcome") == "fallback" && h.S("reason") == "FINGERPRINT_MISMATCH" && len(items(h)) == 2 && h.Body["checkpoint"] == nil, h.Raw)
		h = g.ResponseHistory("othertenant", e1.ResponseID, fpHash, 0)
		check("another tenant: 404 NOT_FOUND", h.Code == 404 && h.S("reason") == "NOT_FOUND", h.Raw)

		// turn 2 at head 1, without an artifact: certified, NO_ARTIFACT
		t2 := Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 1, Text: "again"}
		e2 := t2.Build()
		r.send(e2)
		h = g.ResponseHistory(tenant, e2.ResponseID, fpHash, 10000)
		check("turn 2 wait_ms read: fallback NO_ARTIFACT, 4 items, head_seq 2", h.Code == 200 && h.S("reason") == "NO_ARTIFACT" && len(items(h)) == 4 && h.S("head_seq") == "2", h.Raw)
		c := g.ConversationHistory(tenant, conv, fpHash)
		check("conversation endpoint: head 2, 4 items", c.Code == 200 && c.S("head_seq") == "2" && len(items(c)) == 4, c.Raw)
		h = g.ResponseHistory(tenant, e1.ResponseID, fpHash, 0)
		check("turn 1 read again: head_seq 1, conversation_head_seq 2", h.S("head_seq") == "1" && h.S("conversation_head_seq") == "2", h.Raw)

		// retry of turn 2 (same key, digest, response id, attempt 2): original promotion again
		e2b := t2.Build()
		e2b.Attempt = 2
		r.send(e2b)
		cp = r.promoted("retry of turn 2", e2b)
		if cp != nil {
			check("retry answered with the original: seq 2, attempt 1", fmt.Sprint(cp["seq"], cp["attempt"]) == "2 1", cp)
		}
		// same key + digest, another response id: DUPLICATE naming the original
		t2d := t2
		t2d.Resp = NewID("resp_")
		t2d.Head = 2
		e2d := t2d.Build()
		e2d.InputItems, e2d.OutputItems = e2b.InputItems, e2b.OutputItems
		r.send(e2d)
		rej := r.rejected("retry under another response id", e2d, "DUPLICATE")
		if rej != nil {
			check("DUPLICATE names the original and its seq", rej["existing_response_id"] == e2.ResponseID && fmt.Sprint(rej["head_seq"]) == "2", rej)
		}
		st := g.Status(tenant, e2d.ResponseID)
		check("status of the duplicate: rejected DUPLICATE + existing_response_id", st.S("state") == "rejected" && st.S("reason") == "DUPLICATE" && st.S("existing_response_id") == e2.ResponseID, st.Raw)
		// same key, other digest
		t2r := t2
		t2r.Resp = NewID("resp_")
		t2r.Head = 2
		t2r.Text = "something else"
		e2r := t2r.Build()
		r.send(e2r)
		rej = r.rejected("same key, another request", e2r, "IDEMPOTENCY_KEY_REUSED")
		if rej != nil {
			check("IDEMPOTENCY_KEY_REUSED names the original", rej["existing_response_id"] == e2.ResponseID, rej)
		}
		st = g.Status(tenant, e2r.ResponseID)
		check("status: rejected IDEMPOTENCY_KEY_REUSED + existing_response_id", st.S("reason") == "IDEMPOTENCY_KEY_REUSED" && st.S("existing_response_id") == e2.ResponseID, st.Raw)

		// stale and future heads
		e := Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 1, Text: "stale"}.Build()
		r.send(e)
		rej = r.rejected("expected head older", e, "CONFLICT")
		if rej != nil {
			check("head CONFLICT carries head_seq 2, existing_response_id null", fmt.Sprint(rej["head_seq"]) == "2" && rej["existing_response_id"] == nil, rej)
		}
		e = Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 5, Text: "future"}.Build()
		r.send(e)
		rej = r.rejected("expected head newer", e, "OUT_OF_ORDER")
		if rej != nil {
			check("OUT_OF_ORDER carries head_seq 2", fmt.Sprint(rej["head_seq"]) == "2", rej)
		}
		h = g.ResponseHistory(tenant, e.ResponseID, fpHash, 0)
		check("rejected response: 409 NOT_PROMOTED, response_id set", h.Code == 409 && h.S("reason") == "NOT_PROMOTED" && h.S("response_id") == e.ResponseID, h.Raw)

		// another tenant on the same conversation
		e = Turn{Tenant: "othertenant", Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 2, Text: "intruder"}.Build()
		r.send(e)
		r.rejected("another tenant's turn", e, "TENANT_MISMATCH")

		// response id reused by another request in another conversation
		conv2 := NewID("conv_go_")
		e = Turn{Tenant: tenant, Conv: conv2, Resp: e1.ResponseID, Key: NewID("idem_"), Head: 0, Text: "reuse"}.Build()
		r.send(e)
		rej = r.rejected("response id of conversation 1 reused in conversation 2", e, "CONFLICT")
		if rej != nil {
			check("bound-id CONFLICT: existing_response_id = own id", rej["existing_response_id"] == e1.ResponseID, rej)
		}
		c = g.ConversationHistory(tenant, conv2, fpHash)
		check("conversation 2 has nothing: 404", c.Code == 404, c.Raw)
	}},

	{"statuses and certification", func(r runner) {
		g := r.g
		conv := NewID("conv_go_")
		e := Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "x", Status: "failed"}.Build()
		r.send(e)
		r.rejected("failed", e, "NOT_PROMOTABLE_STATUS")
		e = Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "x", Status: "incomplete", Artifact: true}.Build()
		e.IncompleteReason = S("max_output_tokens")
		r.send(e)
		cp := r.promoted("incomplete", e)
		check("incomplete: logical_only", cp != nil && cp["certification"] == "logical_only", cp)
		h := g.ResponseHistory(tenant, e.ResponseID, fpHash, 0)
		check("incomplete read: fallback NOT_CERTIFIED", h.Code == 200 && h.S("outcome") == "fallback" && h.S("reason") == "NOT_CERTIFIED", h.Raw)
		e = Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 1, Text: "y", Artifact: true}.Build()
		e.EffectiveConfig.Truncation, e.EffectiveConfig.Truncated = "auto", true
		r.send(e)
		cp = r.promoted("truncated", e)
		check("truncated: logical_only", cp != nil && cp["certification"] == "logical_only", cp)
		// expiry in the past: promoted, read EXPIRED
		e = Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 2, Text: "z", Artifact: true}.Build()
		past := time.Now().Add(-time.Minute)
		e.ExpiresAt = &past
		r.send(e)
		r.promoted("already expired", e)
		h = g.ResponseHistory(tenant, e.ResponseID, fpHash, 0)
		check("expired response: 410 EXPIRED", h.Code == 410 && h.S("reason") == "EXPIRED", h.Raw)
		c := g.ConversationHistory(tenant, conv, fpHash)
		check("conversation with an expired head: 410, head_seq null", c.Code == 410 && c.Body["head_seq"] == nil, c.Raw)
		st := g.Status(tenant, e.ResponseID)
		check("status ignores expiry: promoted seq 3", st.S("state") == "promoted" && st.S("seq") == "3", st.Raw)
		// continue past the expired head: renews
		e = Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 3, Text: "renew"}.Build()
		r.send(e)
		r.promoted("turn on an expired head", e)
		c = g.ConversationHistory(tenant, conv, fpHash)
		check("conversation readable again, 8 items", c.Code == 200 && len(items(c)) == 8, c.Raw)
		// expired artifact: NO_ARTIFACT
		e = Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 4, Text: "old art", Artifact: true}.Build()
		e.TokenArtifact.ExpiresAt = time.Now().Add(-time.Second)
		e.BoundaryProof.ExpiresAt = e.TokenArtifact.ExpiresAt
		r.send(e)
		r.promoted("artifact already expired", e)
		h = g.ResponseHistory(tenant, e.ResponseID, fpHash, 0)
		check("artifact expired before processing: NO_ARTIFACT", h.S("reason") == "NO_ARTIFACT", h.Raw)
		// artifact expiring soon: certified, then ARTIFACT_EXPIRED
		e = Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 5, Text: "short art", Artifact: true}.Build()
		e.TokenArtifact.ExpiresAt = time.Now().Add(8 * time.Second)
		e.BoundaryProof.ExpiresAt = e.TokenArtifact.ExpiresAt
		r.send(e)
		r.promoted("short-lived artifact", e)
		h = g.ResponseHistory(tenant, e.ResponseID, fpHash, 0)
		check("short-lived artifact: certified first", h.S("outcome") == "certified", h.Raw)
		time.Sleep(time.Until(e.TokenArtifact.ExpiresAt) + 200*time.Millisecond)
		h = g.ResponseHistory(tenant, e.ResponseID, fpHash, 0)
		check("then fallback ARTIFACT_EXPIRED", h.S("reason") == "ARTIFACT_EXPIRED" && len(items(h)) == 12, h.Raw)
	}},

	{"event checks", func(r runner) {
		conv := NewID("conv_go_")
		mk := func() *TurnCompleted {
			return Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "x", Artifact: true}.Build()
		}
		e := mk()
		e.OutputItems = append([]AvroItem{MustItem(O("type", "hologram_call", "id", "h1")).Avro()}, e.OutputItems...)
		r.send(e)
		r.rejected("unknown item type", e, "UNKNOWN_ITEM_TYPE")
		e = mk()
		e.OutputItems[0].Content = []byte(`{"id":"x"`)
		e.OutputItems[0].ContentDigest = Sha256Hex(e.OutputItems[0].Content)
		r.send(e)
		r.rejected("content not JSON", e, "CORRUPT")
		e = mk()
		e.OutputItems[0].ContentDigest = Sha256Hex([]byte("other"))
		r.send(e)
		r.rejected("content digest mismatch", e, "CORRUPT")
		e = mk()
		e.OutputItems[0].Content = []byte(`{"type":"message","id":"` + e.OutputItems[0].ItemID + `","role":"assistant","content":"a","role":"user"}`)
		e.OutputItems[0].ContentDigest = Sha256Hex(e.OutputItems[0].Content)
		r.send(e)
		r.rejected("duplicate key in content", e, "CORRUPT")
		e = mk()
		e.FingerprintHash = Sha256Hex([]byte("wrong"))
		r.send(e)
		r.rejected("wrong fingerprint_hash", e, "CORRUPT")
		e = mk()
		e.Fingerprint.TokenizerRevision = nil
		e.FingerprintHash = e.Fingerprint.Hash()
		e.TokenArtifact.FingerprintHash, e.BoundaryProof.FingerprintHash = e.FingerprintHash, e.FingerprintHash
		r.send(e)
		r.rejected("fingerprint without tokenizer revision", e, "INCOMPLETE_FINGERPRINT")
		e = mk()
		e.Fingerprint.ModelWeightsRevision = S(" Main ")
		e.FingerprintHash = e.Fingerprint.Hash()
		e.TokenArtifact.FingerprintHash, e.BoundaryProof.FingerprintHash = e.FingerprintHash, e.FingerprintHash
		r.send(e)
		r.rejected("mutable weights revision", e, "INCOMPLETE_FINGERPRINT")
		e = mk()
		e.BoundaryProof.AppendCount = 81
		r.send(e)
		r.rejected("proof counts do not add up", e, "INVALID_BOUNDARY_PROOF")
		e = mk()
		e.TokenArtifact = nil
		r.send(e)
		r.rejected("proof without artifact", e, "INVALID_BOUNDARY_PROOF")
		e = mk()
		e.OutputItems = append([]AvroItem{MustItem(O("type", "function_call_output", "id", "fco_x", "call_id", "call_nowhere", "output", "1")).Avro()}, e.OutputItems...)
		r.send(e)
		r.rejected("output answering no call", e, "UNPAIRED_TOOL_CALL")
		e = mk()
		e.OutputItems = append(e.OutputItems, MustItem(O("type", "reasoning", "id", "rs_end", "summary", []any{})).Avro())
		r.send(e)
		r.rejected("reasoning last", e, "UNPAIRED_TOOL_CALL")
		e = mk()
		e.TenantID = "bad tenant"
		r.send(e)
		r.rejected("tenant id outside the pattern", e, "CORRUPT")
		e = mk()
		e.ExpectedHeadSeq = nil
		r.send(e)
		r.rejected("conversation turn without expected_head_seq", e, "CORRUPT")
		e = mk()
		e.Attempt = 0
		r.send(e)
		r.rejected("attempt 0", e, "CORRUPT")
		// wrong Kafka key: CORRUPT, seen on rejections only; status unknown
		e = mk()
		v, _ := r.g.Encode("TurnCompleted", e)
		r.g.ProduceRaw(r.ctx, "not-the-key", v)
		r.rejected("keyed otherwise", e, "CORRUPT")
		st := r.g.Status(tenant, e.ResponseID)
		check("keyed otherwise: status unknown", st.S("state") == "unknown", st.Raw)
		// and the conversation is still new: a valid turn at head 0 promotes
		e = mk()
		r.send(e)
		r.promoted("valid turn after the rejections", e)
	}},

	{"chain mode", func(r runner) {
		g := r.g
		root := NewID("resp_")
		e1 := Turn{Tenant: tenant, Resp: root, Key: NewID("idem_"), Text: "root", Artifact: true}.Build()
		r.send(e1)
		cp := r.promoted("chain root", e1)
		check("root seq 1, partition_key its own id", cp != nil && fmt.Sprint(cp["seq"]) == "1" && cp["partition_key"] == root, cp)
		c1 := Turn{Tenant: tenant, ChainRoot: root, Prev: root, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "child"}.Build()
		c2 := Turn{Tenant: tenant, ChainRoot: root, Prev: root, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "fork"}.Build()
		r.send(c1)
		r.send(c2)
		cp = r.promoted("child", c1)
		check("child depth 2, item_count 4", cp != nil && fmt.Sprint(cp["seq"], cp["item_count"]) == "2 4", cp)
		r.promoted("fork (second child of the root)", c2)
		h := g.ResponseHistory(tenant, c2.ResponseID, fpHash, 0)
		check("fork history: 4 items, head_seq 2, conversation_head_seq null", len(items(h)) == 4 && h.S("head_seq") == "2" && h.Body["conversation_head_seq"] == nil, h.Raw)
		e := Turn{Tenant: tenant, ChainRoot: root, Prev: NewID("resp_"), Resp: NewID("resp_"), Key: NewID("idem_"), Text: "orphan"}.Build()
		r.send(e)
		r.rejected("parent never promoted", e, "PARENT_NOT_PROMOTED")
		e = Turn{Tenant: tenant, ChainRoot: NewID("resp_"), Prev: root, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "wrong root"}.Build()
		r.send(e)
		r.rejected("continued chain naming another root", e, "PARENT_NOT_PROMOTED")
		e = Turn{Tenant: tenant, ChainRoot: NewID("resp_"), Resp: NewID("resp_"), Key: NewID("idem_"), Text: "first naming another root"}.Build()
		r.send(e)
		r.rejected("first response naming another root", e, "CORRUPT")
		e = Turn{Tenant: "othertenant", ChainRoot: root, Prev: root, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "other tenant"}.Build()
		r.send(e)
		r.rejected("parent promoted by another tenant", e, "TENANT_MISMATCH")
		// first response retried under another response id: DUPLICATE across partitions
		t := Turn{Tenant: tenant, Resp: NewID("resp_"), Key: e1.IdempotencyKey, Text: "root"}
		e = t.Build()
		e.InputItems, e.OutputItems = e1.InputItems, e1.OutputItems
		r.send(e)
		rej := r.rejected("chain first response retried under another id", e, "DUPLICATE")
		check("names the original root", rej != nil && rej["existing_response_id"] == root, rej)
		// a response id reused across partitions: the root's id by a Conversation turn
		e = Turn{Tenant: tenant, Conv: NewID("conv_go_"), Resp: c1.ResponseID, Key: NewID("idem_"), Text: "steal"}.Build()
		r.send(e)
		rej = r.rejected("chain response id reused in a conversation", e, "CONFLICT")
		check("existing_response_id = own id", rej != nil && rej["existing_response_id"] == c1.ResponseID, rej)
		// wait_ms on a never-produced id: 409 after the wait
		h = g.ResponseHistory(tenant, NewID("resp_"), fpHash, 300)
		check("wait_ms on an unknown id: 409 NOT_PROMOTED, no decision", h.Code == 409 && h.S("reason") == "NOT_PROMOTED" && strings.Contains(h.S("detail"), "no decision"), h.Raw)
		h = g.ResponseHistory(tenant, NewID("resp_"), fpHash, 0)
		check("plain read of an unknown id: 404", h.Code == 404, h.Raw)
	}},

	{"tool effects and cancellation", func(r runner) {
		g := r.g
		conv := NewID("conv_go_")
		key := NewID("idem_")
		resp := NewID("resp_")
		call := O("type", "function_call", "id", "fc_"+resp, "call_id", "call_1", "name", "get_weather", "arguments", `{"city":"Paris"}`)
		outObj := O("type", "function_call_output", "id", "fco_"+resp, "call_id", "call_1", "output", `{"temp_c":21}`)
		out := MustItem(outObj)
		eff := &ToolEffect{EventID: UUID(), TenantID: tenant, ConversationID: S(conv), ResponseID: resp,
			ProducedAt: time.Now(), EffectID: EffectID(key, 0, "call_1"), IdempotencyKey: key, Attempt: 1,
			SubturnIndex: 0, CallID: "call_1", ToolName: ToolName(call), ArgumentsDigest: CallArgumentsDigest(call),
			Status: "succeeded", Output: out.Avro(), ExecutedAt: time.Now()}
		t := Turn{Tenant: tenant, Conv: conv, Resp: resp, Key: key, Text: "weather?", Outputs: []*Obj{call, outObj}}
		// the turn without its effect first: MISSING_TOOL_EFFECT
		e := t.Build()
		e.ToolEffectIDs = []string{eff.EffectID}
		r.send(e)
		r.rejected("effect never recorded", e, "MISSING_TOOL_EFFECT")
		// effect, then the turn again (same request, attempt 2): promoted
		if err := g.SendEffect(r.ctx, eff); err != nil {
			check("produce effect", false, err)
		}
		e = t.Build()
		e.Attempt = 2
		e.ToolEffectIDs = []string{eff.EffectID}
		e.Subturns = []Subturn{{Index: 0, EffectIDs: []string{eff.EffectID}}}
		r.send(e)
		// after a rejection, poll /status rather than wait_ms
		var st Answer
		for i := 0; i < 80; i++ {
			st = g.Status(tenant, resp)
			if st.S("state") == "promoted" {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		check("retry after MISSING_TOOL_EFFECT: status promoted seq 1", st.S("state") == "promoted" && st.S("seq") == "1", st.Raw)
		r.promoted("turn with its recorded effect", e)
		orph := g.All("orphaned-effects", field("effect_id", eff.EffectID))
		check("the used effect is never orphaned", len(orph) == 0, orph)

		// a second execution with another output: conflict
		eff2 := *eff
		eff2.EventID = UUID()
		eff2.Output = MustItem(O("type", "function_call_output", "id", "fco_"+resp, "call_id", "call_1", "output", `{"temp_c":99}`)).Avro()
		g.SendEffect(r.ctx, &eff2)
		o, ok := g.Wait("orphaned-effects", decision, and(field("effect_id", eff.EffectID), field("reason", "EFFECT_CONFLICT")))
		check("differing output: EffectOrphaned EFFECT_CONFLICT with its own digest", ok && o["output_digest"] == eff2.Output.ContentDigest, o)

		// DUPLICATE_TOOL_EFFECT: the turn's output differs from the recorded one
		conv2 := NewID("conv_go_")
		key2 := NewID("idem_")
		resp2 := NewID("resp_")
		call2 := O("type", "function_call", "id", "fc_"+resp2, "call_id", "call_9", "name", "get_weather", "arguments", `{}`)
		rec := MustItem(O("type", "function_call_output", "id", "fco_"+resp2, "call_id", "call_9", "output", "recorded"))
		eff3 := &ToolEffect{EventID: UUID(), TenantID: tenant, ConversationID: S(conv2), ResponseID: resp2, ProducedAt: time.Now(),
			EffectID: EffectID(key2, 0, "call_9"), IdempotencyKey: key2, Attempt: 1, CallID: "call_9", ToolName: "get_weather",
			ArgumentsDigest: CallArgumentsDigest(call2), Status: "succeeded", Output: rec.Avro(), ExecutedAt: time.Now()}
		g.SendEffect(r.ctx, eff3)
		e = Turn{Tenant: tenant, Conv: conv2, Resp: resp2, Key: key2, Text: "w", Outputs: []*Obj{call2,
			O("type", "function_call_output", "id", "fco_"+resp2, "call_id", "call_9", "output", "invented")}}.Build()
		e.ToolEffectIDs = []string{eff3.EffectID}
		r.send(e)
		r.rejected("output differs from the recorded effect", e, "DUPLICATE_TOOL_EFFECT")
		// cancel the request: its effect is orphaned TURN_CANCELLED; a later attempt CANCELLED
		cn := &TurnCancelled{EventID: UUID(), TenantID: tenant, ConversationID: S(conv2), ResponseID: resp2,
			ProducedAt: time.Now(), IdempotencyKey: key2, CancelledAt: time.Now()}
		g.SendCancel(r.ctx, cn)
		o, ok = g.Wait("orphaned-effects", decision, and(field("effect_id", eff3.EffectID), field("reason", "TURN_CANCELLED")))
		check("cancellation publishes the effect TURN_CANCELLED, effect_completed true", ok && fmt.Sprint(o["effect_completed"]) == "true" && o["rejection_reason"] == "CANCELLED", o)
		e = Turn{Tenant: tenant, Conv: conv2, Resp: resp2, Key: key2, Text: "w", Outputs: []*Obj{call2,
			O("type", "function_call_output", "id", "fco_"+resp2, "call_id", "call_9", "output", "recorded")}}.Build()
		e.Attempt = 3
		e.ToolEffectIDs = []string{eff3.EffectID}
		r.send(e)
		r.rejected("attempt after the cancellation", e, "CANCELLED")
		// cancellation before any turn
		conv3 := NewID("conv_go_")
		t3 := Turn{Tenant: tenant, Conv: conv3, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "c"}
		g.SendCancel(r.ctx, &TurnCancelled{EventID: UUID(), TenantID: tenant, ConversationID: S(conv3), ResponseID: "never_sent",
			ProducedAt: time.Now(), IdempotencyKey: t3.Key, CancelledAt: time.Now()})
		e = t3.Build()
		r.send(e)
		r.rejected("turn of a cancelled request", e, "CANCELLED")
		h := g.ResponseHistory(tenant, e.ResponseID, fpHash, 0)
		check("cancelled: 409 NOT_PROMOTED", h.Code == 409, h.Raw)
	}},

	{"size limit and dead letters", func(r runner) {
		g := r.g
		conv := NewID("conv_go_")
		// 8 MiB of content in 64 items of 128 KiB: travels and promotes
		t := Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "big"}
		e := t.Build()
		chunk := strings.Repeat("x", 128*1024-120)
		var big []AvroItem
		for i := 0; i < 64; i++ {
			big = append(big, MustItem(O("type", "message", "id", fmt.Sprintf("m%d", i), "role", "assistant",
				"content", []any{O("type", "output_text", "text", chunk, "annotations", []any{})})).Avro())
		}
		e.OutputItems = big
		v, err := g.Encode("TurnCompleted", e)
		check("8 MiB turn encodes within the limit", err == nil, err, " ", len(v))
		if err == nil {
			g.ProduceRaw(r.ctx, e.Key(), v)
			cp := r.promoted("8 MiB turn", e)
			check("8 MiB turn: 65 items", cp != nil && fmt.Sprint(cp["item_count"]) == "65", cp)
			h := g.ResponseHistory(tenant, e.ResponseID, fpHash, 0)
			check("8 MiB history served", h.Code == 200 && len(items(h)) == 65, h.Code)
		}
		// above the limit: the gateway refuses; sent anyway, UNSUPPORTED_FORMAT
		e = Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 1, Text: "too big"}.Build()
		for i := 0; i < 84; i++ {
			e.OutputItems = append([]AvroItem{MustItem(O("type", "message", "id", fmt.Sprintf("n%d", i), "role", "assistant",
				"content", []any{O("type", "output_text", "text", chunk, "annotations", []any{})})).Avro()}, e.OutputItems...)
		}
		_, err = g.Encode("TurnCompleted", e)
		check("gateway refuses a turn above 10 MiB", err != nil && strings.Contains(err.Error(), "size limit"), err)
		ws := g.schemas["TurnCompleted"]
		body, _ := avroAPI.Marshal(ws.Schema, e)
		if _, _, err := g.ProduceRaw(r.ctx, e.Key(), Frame(ws.ID, body)); err != nil {
			check("produce the oversized turn anyway", false, err)
		} else {
			r.rejected("oversized turn", e, "UNSUPPORTED_FORMAT")
		}
		// dead letters: bad magic byte, unknown schema id, truncated
		for _, c := range []struct {
			name, reason string
			value        []byte
		}{
			{"bad magic byte", "BAD_MAGIC_BYTE", []byte{1, 0, 0, 0, 2, 0}},
			{"unknown schema id", "UNKNOWN_SCHEMA_ID", []byte{0, 0x7f, 0xff, 0xff, 0xf0, 0}},
			{"truncated", "TRUNCATED", []byte{0, 0}},
		} {
			p, off, err := g.ProduceRaw(r.ctx, conv, c.value)
			if err != nil {
				check(c.name+": produce", false, err)
				continue
			}
			d, ok := g.Wait("dead-letters", decision, and(field("source_partition", p), field("source_offset", off)))
			check(c.name+": dead-lettered "+c.reason+" at its partition and offset", ok && d["reason"] == c.reason, d)
		}
	}},

	{"effect claims", func(r runner) {
		g := r.g
		conv := NewID("conv_go_")
		key := NewID("idem_")
		resp := NewID("resp_")
		call := O("type", "function_call", "id", "fc_"+resp, "call_id", "call_a", "name", "send_email", "arguments", `{"to":"x"}`)
		effID := ClaimedEffectID(key, 0, "send_email", 0)
		claim := func(token string, extra ...any) Answer {
			req := map[string]any{"tenant_id": tenant, "idempotency_key": key, "partition_key": conv, "attempt": 1,
				"subturn_index": 0, "tool_name": "send_email", "occurrence": 0, "arguments_digest": CallArgumentsDigest(call),
				"call_id": "call_a", "token": token, "lease_ms": 60000, "policy": "at_most_once", "effect_id": effID, "response_id": resp}
			for i := 0; i+1 < len(extra); i += 2 {
				req[extra[i].(string)] = extra[i+1]
			}
			return g.Claim(req)
		}
		tok := UUID()
		a := claim(tok)
		check("first claim: CLAIMED with the computed effect_id", a.Code == 200 && a.S("state") == "CLAIMED" && a.S("effect_id") == effID, a.Raw)
		a = claim(tok)
		check("same token again: CLAIMED", a.S("state") == "CLAIMED", a.Raw)
		a = claim(UUID())
		check("another token while the lease is live: IN_PROGRESS with wait_ms", a.S("state") == "IN_PROGRESS" && a.S("wait_ms") != "", a.Raw)
		a = claim(UUID(), "effect_id", "eff_00000000000000000000000000000000")
		check("wrong effect_id: 409 EFFECT_KEY_MISMATCH", a.Code == 409 && a.S("error") == "EFFECT_KEY_MISMATCH", a.Raw)
		outObj := O("type", "function_call_output", "id", "fco_"+resp, "call_id", "call_a", "output", "sent")
		out := MustItem(outObj)
		outJSON := map[string]any{"item_id": out.ItemID, "type": out.Type, "role": nil, "call_id": "call_a",
			"content": string(out.Content), "content_digest": out.ContentDigest, "format_version": 1}
		comp := func(token string, o map[string]any) Answer {
			return g.Complete(effID, map[string]any{"tenant_id": tenant, "idempotency_key": key, "partition_key": conv,
				"token": token, "status": "succeeded", "output": o})
		}
		a = comp(UUID(), outJSON)
		check("completion by a non-holder: 409 NOT_HOLDER", a.Code == 409 && a.S("error") == "NOT_HOLDER", a.Raw)
		a = g.Complete(ClaimedEffectID(key, 5, "send_email", 0), map[string]any{"tenant_id": tenant, "idempotency_key": key,
			"partition_key": conv, "token": tok, "status": "succeeded", "output": outJSON})
		check("completion of an unknown claim: 404 UNKNOWN_CLAIM", a.Code == 404 && a.S("error") == "UNKNOWN_CLAIM", a.Raw)
		a = comp(tok, outJSON)
		check("completion by the holder: COMPLETED", a.Code == 200 && a.S("state") == "COMPLETED", a.Raw)
		a = comp(tok, outJSON)
		check("same completion again: ALREADY_COMPLETED", a.Code == 200 && a.S("state") == "ALREADY_COMPLETED", a.Raw)
		o2 := map[string]any{}
		for k, v := range outJSON {
			o2[k] = v
		}
		alt := MustItem(O("type", "function_call_output", "id", "fco_"+resp, "call_id", "call_a", "output", "other"))
		o2["content"], o2["content_digest"] = string(alt.Content), alt.ContentDigest
		a = comp(tok, o2)
		check("another outcome by the holder: 409 OUTCOME_CONFLICT", a.Code == 409 && a.S("error") == "OUTCOME_CONFLICT", a.Raw)
		a = claim(UUID())
		ob, _ := a.Body["output"].(map[string]any)
		check("a later claim: COMPLETED with the recorded output", a.S("state") == "COMPLETED" && ob != nil && ob["content_digest"] == out.ContentDigest, a.Raw)
		a = claim(UUID(), "arguments_digest", Sha256Hex([]byte("{}")))
		check("other arguments at the same place: CONFLICT", a.S("state") == "CONFLICT", a.Raw)
		// record the run, then the turn listing the claimed effect
		eff := &ToolEffect{EventID: UUID(), TenantID: tenant, ConversationID: S(conv), ResponseID: resp, ProducedAt: time.Now(),
			EffectID: effID, IdempotencyKey: key, Attempt: 1, CallID: "call_a", ToolName: "send_email",
			ArgumentsDigest: CallArgumentsDigest(call), Status: "succeeded", Output: out.Avro(), ExecutedAt: time.Now()}
		g.SendEffect(r.ctx, eff)
		e := Turn{Tenant: tenant, Conv: conv, Resp: resp, Key: key, Text: "mail", Outputs: []*Obj{call, outObj}}.Build()
		e.Subturns = []Subturn{{Index: 0, EffectIDs: []string{effID}}}
		e.ToolEffectIDs = []string{effID}
		r.send(e)
		r.promoted("turn using the claimed effect", e)
		a = claim(UUID())
		check("claim after the promotion: PROMOTED naming the response and digest", a.S("state") == "PROMOTED" && a.S("existing_response_id") == resp && a.S("existing_request_digest") == e.RequestDigest && a.Body["attempt"] == nil, a.Raw)
		// lease expiry under at_most_once
		key2 := NewID("idem_")
		req := func(token, policy string) map[string]any {
			return map[string]any{"tenant_id": tenant, "idempotency_key": key2, "partition_key": conv, "attempt": 1,
				"subturn_index": 0, "tool_name": "charge", "occurrence": 0, "arguments_digest": Sha256Hex([]byte("{}")),
				"call_id": "call_b", "token": token, "lease_ms": 100, "policy": policy}
		}
		a = g.Claim(req(UUID(), "at_most_once"))
		check("short lease: CLAIMED", a.S("state") == "CLAIMED", a.Raw)
		time.Sleep(300 * time.Millisecond)
		a = g.Claim(req(UUID(), "at_most_once"))
		check("expired lease, at_most_once: LEASE_EXPIRED", a.S("state") == "LEASE_EXPIRED", a.Raw)
		a = g.Claim(req(UUID(), "at_least_once"))
		check("expired lease, at_least_once: CLAIMED taking over attempt 1", a.S("state") == "CLAIMED" && a.S("previous_attempt") == "1", a.Raw)
		// a cancelled request: CANCELLED
		key3 := NewID("idem_")
		g.SendCancel(r.ctx, &TurnCancelled{EventID: UUID(), TenantID: tenant, ConversationID: S(conv), ResponseID: NewID("resp_"),
			ProducedAt: time.Now(), IdempotencyKey: key3, CancelledAt: time.Now()})
		time.Sleep(3 * time.Second) // a cancellation publishes nothing: give the worker time
		var st string
		for i := 0; i < 1; i++ {
			rq := req(UUID(), "at_most_once")
			rq["idempotency_key"] = key3
			a = g.Claim(rq)
			st = a.S("state")
			if st == "CLAIMED" {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		check("claim of a cancelled request: CANCELLED", st == "CANCELLED", a.Raw)
		a = g.Claim(map[string]any{"tenant_id": tenant})
		check("malformed claim: 422 INVALID_REQUEST", a.Code == 422 && a.S("error") == "INVALID_REQUEST", a.Raw)
	}},
	{"API shapes", func(r runner) {
		g := r.g
		conv := NewID("conv_go_")
		e := Turn{Tenant: tenant, Conv: conv, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "shape"}.Build()
		past := time.Now().Add(-time.Second)
		e.ExpiresAt = &past
		r.send(e)
		r.promoted("expired turn", e)
		h := g.ResponseHistory(tenant, e.ResponseID, fpHash, 0)
		check("410 body: response_id, head_seq, items, checkpoint null", h.Code == 410 && h.Body["response_id"] == nil && h.Body["head_seq"] == nil && h.Body["items"] == nil && h.Body["checkpoint"] == nil, h.Raw)
		h = g.ResponseHistory(tenant, NewID("resp_"), fpHash, 0)
		check("404 body: response_id null, detail set", h.Code == 404 && h.Body["response_id"] == nil && h.S("detail") != "", h.Raw)
		st := g.Status(tenant, NewID("resp_"))
		check("status of an unknown id: 200 unknown, reason and seq null", st.Code == 200 && st.S("state") == "unknown" && st.Body["reason"] == nil && st.Body["seq"] == nil, st.Raw)
		h = g.ResponseHistory(tenant, e.ResponseID, strings.ToUpper(fpHash), 0)
		check("uppercase fingerprint_hash: 422 INVALID_REQUEST, retryable false", h.Code == 422 && h.S("error") == "INVALID_REQUEST" && h.S("retryable") == "false", h.Raw)
		a := g.do("GET", "/v1/responses/"+e.ResponseID+"/status/", nil, nil)
		check("trailing slash: 404 INVALID_REQUEST, not redirected", a.Code == 404 && a.S("error") == "INVALID_REQUEST", a.Code, a.Raw)
		a = g.do("DELETE", "/v1/responses/"+e.ResponseID+"/status", nil, nil)
		check("unknown method: 405 INVALID_REQUEST", a.Code == 405 && a.S("error") == "INVALID_REQUEST", a.Code, a.Raw)
		a = g.do("GET", "/v1/responses/"+e.ResponseID+"/status?tenant_id=a&tenant_id="+tenant, nil, nil)
		check("a parameter given twice counts with its last value", a.Code == 200 && a.S("state") == "promoted", a.Raw)
	}},
	{"response id binding", func(r runner) {
		// a rejected turn still binds its id; a failed one binds nothing (section 7)
		convA, convB := NewID("conv_go_"), NewID("conv_go_")
		e := Turn{Tenant: tenant, Conv: convA, Resp: NewID("resp_"), Key: NewID("idem_"), Head: 3, Text: "ahead"}.Build()
		r.send(e)
		r.rejected("turn ahead of the head", e, "OUT_OF_ORDER")
		e2 := Turn{Tenant: tenant, Conv: convB, Resp: e.ResponseID, Key: NewID("idem_"), Text: "reuse rejected id"}.Build()
		r.send(e2)
		rej := r.rejected("id of a rejected turn reused by another request", e2, "CONFLICT")
		check("bound by the rejected turn: existing_response_id own id, head_seq null", rej != nil && rej["existing_response_id"] == e.ResponseID && rej["head_seq"] == nil, rej)
		f := Turn{Tenant: tenant, Conv: convA, Resp: NewID("resp_"), Key: NewID("idem_"), Text: "bg", Status: "in_progress"}.Build()
		r.send(f)
		r.rejected("in_progress turn", f, "NOT_PROMOTABLE_STATUS")
		f2 := Turn{Tenant: tenant, Conv: convB, Resp: f.ResponseID, Key: NewID("idem_"), Text: "reuse unbound id"}.Build()
		r.send(f2)
		r.promoted("id of an in_progress turn reused by another request", f2)
	}},
}

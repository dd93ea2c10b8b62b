package main

// go run . : drives a running worker and API through every outcome the docs describe
// that a gateway can provoke from outside, and checks each record and answer.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

var (
	passed, failed int
	findings       []string
)

func check(name string, ok bool, detail ...any) {
	if ok {
		passed++
		fmt.Printf("  ok   %s\n", name)
		return
	}
	failed++
	msg := fmt.Sprintf("  FAIL %s %s", name, fmt.Sprint(detail...))
	fmt.Println(msg)
	findings = append(findings, msg)
}

const decision = 40 * time.Second

var fpDefault = Fingerprint{
	FingerprintVersion: 1, ModelName: S("openai/gpt-oss-20b"),
	ModelWeightsRevision: S("6cee5e81ee83917806bbde320786a8fb61efebee"),
	TokenizerName:        S("openai/gpt-oss-20b"), TokenizerRevision: S("6cee5e81ee83917806bbde320786a8fb61efebee"),
	RendererName: S("harmony"), RendererVersion: S("0.0.4"),
	ChatTemplateDigest: S(Sha256Hex([]byte("{% for m in messages %}{{ m.content }}{% endfor %}"))),
	ChatTemplateArgs:   S("{}"), ReasoningFlags: S("{}"), ToolParser: S("openai"),
	InstructionsDigest: S(Sha256Hex(nil)), ToolsDigest: S(ToolsDigest([]any{})),
	MultimodalInputDigests: []string{}, BlockHashFormat: S("sha256-cbor-v1"),
	RouterKeyFormat: S("prefix-blocks-v1"), BlockSize: I(16), ItemFormatVersion: I(1),
}
var fpHash = fpDefault.Hash()

// Turn describes one logical request's attempt.
type Turn struct {
	Tenant, Conv, ChainRoot, Prev, Resp, Key string
	Head                                     int64
	Text                                     string
	Status                                   string
	Artifact                                 bool
	Outputs                                  []*Obj // extra output items before the answer
}

func (t Turn) Build() *TurnCompleted {
	req := O("model", "openai/gpt-oss-20b", "input", t.Text)
	tc := &TurnCompleted{EventID: UUID(), TenantID: t.Tenant, ResponseID: t.Resp, ProducedAt: time.Now(),
		IdempotencyKey: t.Key, Attempt: 1, Status: "completed", Subturns: []Subturn{}, ToolEffectIDs: []string{},
		EffectiveConfig: EffectiveConfig{InstructionsDigest: *fpDefault.InstructionsDigest,
			ToolsDigest: *fpDefault.ToolsDigest, ToolChoice: S("auto"), Truncation: "disabled"},
		Fingerprint: fpDefault, FingerprintHash: fpHash}
	if t.Status != "" {
		tc.Status = t.Status
	}
	if t.Conv != "" {
		tc.ConversationID = S(t.Conv)
		tc.ExpectedHeadSeq = L(t.Head)
		req.Set("conversation", t.Conv)
	} else {
		if t.ChainRoot != "" {
			tc.ChainRootID = S(t.ChainRoot)
		}
		if t.Prev != "" {
			tc.PreviousResponseID = S(t.Prev)
			req.Set("previous_response_id", t.Prev)
		}
	}
	tc.RequestDigest = Sha256Hex(MustCanonical(req))
	in := MustItem(O("type", "message", "id", t.Resp+":in:0", "role", "user",
		"content", []any{O("type", "input_text", "text", t.Text)}))
	tc.InputItems = []AvroItem{in.Avro()}
	for _, o := range t.Outputs {
		tc.OutputItems = append(tc.OutputItems, MustItem(o).Avro())
	}
	out := MustItem(O("type", "message", "id", "msg_"+t.Resp, "role", "assistant", "status", "completed",
		"content", []any{O("type", "output_text", "text", "answer to "+t.Text, "annotations", []any{})}))
	tc.OutputItems = append(tc.OutputItems, out.Avro())
	if t.Artifact {
		exp := time.Now().Add(time.Hour)
		tc.TokenArtifact = &TokenArtifact{ArtifactID: "art_" + t.Resp, TokenHash: Sha256Hex([]byte("tok" + t.Resp)),
			TokenCount: 200, SafeAppendBoundary: 200, FingerprintHash: fpHash, ExpiresAt: exp}
		tc.BoundaryProof = &BoundaryProof{PrefixHash: Sha256Hex([]byte("p" + t.Resp)), PrefixCount: 120,
			AppendHash: Sha256Hex([]byte("a" + t.Resp)), AppendCount: 80, CombinedHash: tc.TokenArtifact.TokenHash,
			CombinedCount: 200, BoundaryKind: "message_end", FingerprintHash: fpHash, ExpiresAt: exp}
	}
	return tc
}

type runner struct {
	g   *Gateway
	ctx context.Context
}

func (r runner) send(t *TurnCompleted) {
	if err := r.g.SendTurn(r.ctx, t); err != nil {
		check("produce "+t.ResponseID, false, err)
	}
}

// promoted waits for the decision of an event and checks it is a CheckpointPromoted.
func (r runner) promoted(name string, t *TurnCompleted) map[string]any {
	topic, rec := r.g.Decision(t.TenantID, t.ResponseID, decision)
	if topic != "checkpoints" {
		check(name+": promoted", false, "got ", topic, " ", rec)
		return nil
	}
	check(name+": promoted", true)
	return rec
}

// rejected waits for the decision of an event and checks its rejection reason.
func (r runner) rejected(name string, t *TurnCompleted, reason string) map[string]any {
	topic, rec := r.g.Decision(t.TenantID, t.ResponseID, decision)
	if topic != "rejections" {
		check(name+": rejected "+reason, false, "got ", topic, " ", rec)
		return nil
	}
	check(name+": rejected "+reason, fmt.Sprint(rec["reason"]) == reason, "got ", rec["reason"], " detail ", rec["detail"])
	return rec
}

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, err := NewGateway(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-gateway:", err)
		os.Exit(1)
	}
	r := runner{g, ctx}
	only := ""
	if len(os.Args) > 1 {
		only = os.Args[1]
	}
	for _, s := range scenarios {
		if only != "" && !strings.Contains(s.name, only) {
			continue
		}
		fmt.Println("==", s.name)
		s.run(r)
	}
	fmt.Printf("\n%d checks passed, %d failed\n", passed, failed)
	for _, f := range findings {
		fmt.Println(f)
	}
	if failed > 0 {
		os.Exit(1)
	}
}

type scenario struct {
	name string
	run  func(r runner)
}

var errSkip = errors.New("skip")

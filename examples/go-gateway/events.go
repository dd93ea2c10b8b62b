package main

// The three gateway events as Go structs that hamba/avro encodes with the registry's
// schema texts (field names are the Avro names; pointers are the ["null", T] unions).

import (
	"time"
)

type AvroItem struct {
	ItemID        string  `avro:"item_id"`
	Type          string  `avro:"type"`
	Role          *string `avro:"role"`
	CallID        *string `avro:"call_id"`
	Content       []byte  `avro:"content"`
	ContentDigest string  `avro:"content_digest"`
	FormatVersion int     `avro:"format_version"`
}

func (it Item) Avro() AvroItem {
	return AvroItem{it.ItemID, it.Type, it.Role, it.CallID, it.Content, it.ContentDigest, it.FormatVersion}
}

type EffectiveConfig struct {
	InstructionsDigest string  `avro:"instructions_digest"`
	ToolsDigest        string  `avro:"tools_digest"`
	ToolChoice         *string `avro:"tool_choice"`
	Truncation         string  `avro:"truncation"`
	Truncated          bool    `avro:"truncated"`
}

type Fingerprint struct {
	FingerprintVersion     int      `avro:"fingerprint_version"`
	ModelName              *string  `avro:"model_name"`
	ModelWeightsRevision   *string  `avro:"model_weights_revision"`
	TokenizerName          *string  `avro:"tokenizer_name"`
	TokenizerRevision      *string  `avro:"tokenizer_revision"`
	RendererName           *string  `avro:"renderer_name"`
	RendererVersion        *string  `avro:"renderer_version"`
	ChatTemplateDigest     *string  `avro:"chat_template_digest"`
	ChatTemplateArgs       *string  `avro:"chat_template_args"`
	ReasoningParser        *string  `avro:"reasoning_parser"`
	ReasoningFlags         *string  `avro:"reasoning_flags"`
	ToolParser             *string  `avro:"tool_parser"`
	InstructionsDigest     *string  `avro:"instructions_digest"`
	ToolsDigest            *string  `avro:"tools_digest"`
	LoraName               *string  `avro:"lora_name"`
	LoraRevision           *string  `avro:"lora_revision"`
	MultimodalInputDigests []string `avro:"multimodal_input_digests"`
	CacheSaltDigest        *string  `avro:"cache_salt_digest"`
	BlockHashFormat        *string  `avro:"block_hash_format"`
	RouterKeyFormat        *string  `avro:"router_key_format"`
	BlockSize              *int     `avro:"block_size"`
	ItemFormatVersion      *int     `avro:"item_format_version"`
}

func sp(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}

func ip(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// Hash is fingerprint_hash: all 22 fields by their Avro names.
func (f Fingerprint) Hash() string {
	mm := f.MultimodalInputDigests
	if mm == nil {
		mm = []string{}
	}
	return FingerprintHash(map[string]any{
		"fingerprint_version": f.FingerprintVersion, "model_name": sp(f.ModelName),
		"model_weights_revision": sp(f.ModelWeightsRevision), "tokenizer_name": sp(f.TokenizerName),
		"tokenizer_revision": sp(f.TokenizerRevision), "renderer_name": sp(f.RendererName),
		"renderer_version": sp(f.RendererVersion), "chat_template_digest": sp(f.ChatTemplateDigest),
		"chat_template_args": sp(f.ChatTemplateArgs), "reasoning_parser": sp(f.ReasoningParser),
		"reasoning_flags": sp(f.ReasoningFlags), "tool_parser": sp(f.ToolParser),
		"instructions_digest": sp(f.InstructionsDigest), "tools_digest": sp(f.ToolsDigest),
		"lora_name": sp(f.LoraName), "lora_revision": sp(f.LoraRevision),
		"multimodal_input_digests": mm, "cache_salt_digest": sp(f.CacheSaltDigest),
		"block_hash_format": sp(f.BlockHashFormat), "router_key_format": sp(f.RouterKeyFormat),
		"block_size": ip(f.BlockSize), "item_format_version": ip(f.ItemFormatVersion),
	})
}

type BoundaryProof struct {
	PrefixHash      string    `avro:"prefix_hash"`
	PrefixCount     int64     `avro:"prefix_count"`
	AppendHash      string    `avro:"append_hash"`
	AppendCount     int64     `avro:"append_count"`
	CombinedHash    string    `avro:"combined_hash"`
	CombinedCount   int64     `avro:"combined_count"`
	BoundaryKind    string    `avro:"boundary_kind"`
	FingerprintHash string    `avro:"fingerprint_hash"`
	ExpiresAt       time.Time `avro:"expires_at"`
}

type TokenArtifact struct {
	ArtifactID         string    `avro:"artifact_id"`
	TokenHash          string    `avro:"token_hash"`
	TokenCount         int64     `avro:"token_count"`
	SafeAppendBoundary int64     `avro:"safe_append_boundary"`
	FingerprintHash    string    `avro:"fingerprint_hash"`
	ExpiresAt          time.Time `avro:"expires_at"`
}

type RouterReceipt struct {
	ReceiptID       string    `avro:"receipt_id"`
	RouterKeyFormat string    `avro:"router_key_format"`
	CoveredTokens   int64     `avro:"covered_tokens"`
	ExpiresAt       time.Time `avro:"expires_at"`
	Issuer          string    `avro:"issuer"`
}

type Subturn struct {
	Index                int      `avro:"index"`
	EphemeralArtifactRef *string  `avro:"ephemeral_artifact_ref"`
	EffectIDs            []string `avro:"effect_ids"`
}

type StreamInfo struct {
	Streamed           bool `avro:"streamed"`
	ClientDisconnected bool `avro:"client_disconnected"`
}

type TurnCompleted struct {
	EventID            string          `avro:"event_id"`
	TenantID           string          `avro:"tenant_id"`
	ConversationID     *string         `avro:"conversation_id"`
	ChainRootID        *string         `avro:"chain_root_id"`
	ResponseID         string          `avro:"response_id"`
	ProducedAt         time.Time       `avro:"produced_at"`
	IdempotencyKey     string          `avro:"idempotency_key"`
	RequestDigest      string          `avro:"request_digest"`
	Attempt            int             `avro:"attempt"`
	PreviousResponseID *string         `avro:"previous_response_id"`
	ExpectedHeadSeq    *int64          `avro:"expected_head_seq"`
	Status             string          `avro:"status"`
	IncompleteReason   *string         `avro:"incomplete_reason"`
	InputItems         []AvroItem      `avro:"input_items"`
	OutputItems        []AvroItem      `avro:"output_items"`
	EffectiveConfig    EffectiveConfig `avro:"effective_config"`
	Fingerprint        Fingerprint     `avro:"fingerprint"`
	FingerprintHash    string          `avro:"fingerprint_hash"`
	BoundaryProof      *BoundaryProof  `avro:"boundary_proof"`
	TokenArtifact      *TokenArtifact  `avro:"token_artifact"`
	RouterReceipt      *RouterReceipt  `avro:"router_receipt"`
	Subturns           []Subturn       `avro:"subturns"`
	ToolEffectIDs      []string        `avro:"tool_effect_ids"`
	Stream             StreamInfo      `avro:"stream"`
	ExpiresAt          *time.Time      `avro:"expires_at"`
	GatewayID          *string         `avro:"gateway_id"`
}

func (t *TurnCompleted) Key() string {
	return PartitionKey(t.ConversationID, t.ChainRootID, t.ResponseID)
}

type ToolEffect struct {
	EventID         string    `avro:"event_id"`
	TenantID        string    `avro:"tenant_id"`
	ConversationID  *string   `avro:"conversation_id"`
	ChainRootID     *string   `avro:"chain_root_id"`
	ResponseID      string    `avro:"response_id"`
	ProducedAt      time.Time `avro:"produced_at"`
	EffectID        string    `avro:"effect_id"`
	IdempotencyKey  string    `avro:"idempotency_key"`
	Attempt         int       `avro:"attempt"`
	SubturnIndex    int       `avro:"subturn_index"`
	CallID          string    `avro:"call_id"`
	ToolName        string    `avro:"tool_name"`
	ArgumentsDigest string    `avro:"arguments_digest"`
	Status          string    `avro:"status"`
	Output          AvroItem  `avro:"output"`
	ExecutedAt      time.Time `avro:"executed_at"`
}

func (e *ToolEffect) Key() string { return PartitionKey(e.ConversationID, e.ChainRootID, e.ResponseID) }

type TurnCancelled struct {
	EventID        string    `avro:"event_id"`
	TenantID       string    `avro:"tenant_id"`
	ConversationID *string   `avro:"conversation_id"`
	ChainRootID    *string   `avro:"chain_root_id"`
	ResponseID     string    `avro:"response_id"`
	ProducedAt     time.Time `avro:"produced_at"`
	IdempotencyKey string    `avro:"idempotency_key"`
	CancelledAt    time.Time `avro:"cancelled_at"`
}

func (c *TurnCancelled) Key() string {
	return PartitionKey(c.ConversationID, c.ChainRootID, c.ResponseID)
}

func S(s string) *string { return &s }
func I(i int) *int       { return &i }
func L(i int64) *int64   { return &i }

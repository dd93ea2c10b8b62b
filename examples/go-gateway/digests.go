package main

// Digests, ids and keys (docs/gateway-protocol.md sections 1, 4 and 5).

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"regexp"
	"strings"
)

// IDPattern is the one regular expression of docs/gateway-protocol.md's introduction.
var IDPattern = regexp.MustCompile(`^(?:[A-Za-z0-9_:\-][A-Za-z0-9._:\-]{0,199}|\.[A-Za-z0-9_:\-][A-Za-z0-9._:\-]{0,198}|\.\.[A-Za-z0-9._:\-]{1,198})$`)

// PartitionKey: conversation_id, else chain_root_id, else response_id (section 1).
func PartitionKey(conversationID, chainRootID *string, responseID string) string {
	if conversationID != nil {
		return *conversationID
	}
	if chainRootID != nil {
		return *chainRootID
	}
	return responseID
}

// Partition = CRC-32/ISO-HDLC of the key bytes, unsigned, mod the partition count.
func Partition(key []byte, n int) int {
	return int(crc32.ChecksumIEEE(key) % uint32(n))
}

// Item is the Avro record Item.
type Item struct {
	ItemID        string
	Type          string
	Role          *string
	CallID        *string
	Content       []byte
	ContentDigest string
	FormatVersion int
}

var ErrInvalidItem = errors.New("invalid gateway item")

// NewItem builds an Item from a full Responses item object (with its id and type).
func NewItem(obj *Obj) (Item, error) {
	id, ok := obj.Vals["id"].(string)
	if !ok || id == "" {
		return Item{}, ErrInvalidItem
	}
	typ, ok := obj.Vals["type"].(string)
	if !ok {
		return Item{}, ErrInvalidItem
	}
	it := Item{ItemID: id, Type: typ, FormatVersion: 1}
	for _, f := range []struct {
		k   string
		dst **string
	}{{"role", &it.Role}, {"call_id", &it.CallID}} {
		if v, present := obj.Vals[f.k]; present && v != nil {
			s, ok := v.(string)
			if !ok {
				return Item{}, ErrInvalidItem
			}
			*f.dst = &s
		}
	}
	c, err := Canonical(obj)
	if err != nil {
		return Item{}, err
	}
	it.Content = c
	it.ContentDigest = Sha256Hex(c)
	return it, nil
}

func MustItem(obj *Obj) Item {
	it, err := NewItem(obj)
	if err != nil {
		panic(err)
	}
	return it
}

func idHash(parts ...any) string {
	return "eff_" + Sha256Hex(MustCanonical(parts))[:32]
}

// EffectID of an unclaimed effect.
func EffectID(idempotencyKey string, subturn int, callID string) string {
	return idHash(idempotencyKey, subturn, callID)
}

// ClaimedEffectID of a claimed effect (section 8).
func ClaimedEffectID(idempotencyKey string, subturn int, toolName string, occurrence int) string {
	return idHash("claim", idempotencyKey, subturn, toolName, occurrence)
}

// ArgumentsDigest of a parsed arguments value (a JSON text or a structured value).
func ArgumentsDigest(v any, present bool) string {
	if !present || v == nil && !present {
		return Sha256Hex([]byte("{}"))
	}
	if s, ok := v.(string); ok {
		if s == "" {
			return Sha256Hex([]byte("{}"))
		}
		parsed, err := ParseJSON(s)
		var c []byte
		if err == nil {
			if _, isObj := parsed.(*Obj); !isObj {
				parsed = O("__value__", parsed)
			}
			c, err = Canonical(parsed)
		}
		if err != nil {
			return Sha256Hex(MustCanonical(O("__raw__", s)))
		}
		return Sha256Hex(c)
	}
	if _, isObj := v.(*Obj); !isObj {
		v = O("__value__", v)
	}
	return Sha256Hex(MustCanonical(v))
}

// CallArgumentsDigest: the field the call's type names (section 4).
func CallArgumentsDigest(call *Obj) string {
	field := "arguments"
	switch call.Vals["type"] {
	case "custom_tool_call":
		field = "input"
	case "computer_call", "local_shell_call", "shell_call":
		field = "action"
	case "apply_patch_call":
		field = "operation"
	}
	v, ok := call.Vals[field]
	return ArgumentsDigest(v, ok)
}

// ToolName: the call's name, else its type without "_call".
func ToolName(call *Obj) string {
	if n, ok := call.Vals["name"].(string); ok {
		return n
	}
	t, _ := call.Vals["type"].(string)
	return strings.TrimSuffix(t, "_call")
}

var secretKeys = map[string]bool{"headers": true, "authorization": true, "api_key": true, "apikey": true,
	"password": true, "secret": true, "token": true, "access_token": true, "refresh_token": true,
	"client_secret": true, "credentials": true, "cookie": true, "bearer": true}
var secretSuffixes = []string{"_secret", "_password", "_api_key", "_token", "_credentials"}

func isSecret(k string) bool {
	l := strings.ToLower(k)
	if secretKeys[l] {
		return true
	}
	for _, s := range secretSuffixes {
		if strings.HasSuffix(l, s) {
			return true
		}
	}
	return false
}

// SanitizeTools removes secret keys at every depth except inside "parameters".
func SanitizeTools(v any) any {
	switch t := v.(type) {
	case *Obj:
		o := &Obj{Vals: map[string]any{}}
		for _, k := range t.Keys {
			if isSecret(k) {
				continue
			}
			if k == "parameters" {
				o.Set(k, t.Vals[k])
			} else {
				o.Set(k, SanitizeTools(t.Vals[k]))
			}
		}
		return o
	case []any:
		a := make([]any, len(t))
		for i, x := range t {
			a[i] = SanitizeTools(x)
		}
		return a
	}
	return v
}

func ToolsDigest(tools []any) string { return Sha256Hex(MustCanonical(SanitizeTools(tools))) }

func CacheSaltDigest(salt string) string {
	h := sha256.New()
	h.Write([]byte("ratchet/cache_salt/v1"))
	h.Write([]byte{0})
	h.Write([]byte(salt))
	return hex.EncodeToString(h.Sum(nil))
}

// FingerprintFields, in schema order.
var FingerprintFields = []string{"fingerprint_version", "model_name", "model_weights_revision",
	"tokenizer_name", "tokenizer_revision", "renderer_name", "renderer_version",
	"chat_template_digest", "chat_template_args", "reasoning_parser", "reasoning_flags",
	"tool_parser", "instructions_digest", "tools_digest", "lora_name", "lora_revision",
	"multimodal_input_digests", "cache_salt_digest", "block_hash_format",
	"router_key_format", "block_size", "item_format_version"}

// FingerprintHash: sha256 of the canonical JSON of all 22 fields (missing ones null).
func FingerprintHash(fp map[string]any) string {
	o := &Obj{Vals: map[string]any{}}
	for _, f := range FingerprintFields {
		o.Set(f, fp[f])
	}
	return Sha256Hex(MustCanonical(o))
}

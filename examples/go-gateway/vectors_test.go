package main

// Reproduces every published test vector (docs/vectors/*.json). Run: go test ./...
// The events' Avro bytes need the schema registry (RATCHET_SCHEMA_REGISTRY_URL, default
// the local one) and a worker that registered the schemas once.

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var vectorsDir = filepath.Join("..", "..", "docs", "vectors")

func load(t *testing.T, name string, into any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorsDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatal(err)
	}
}

// raw parses a vector's JSON value again with this gateway's parser (number texts kept).
func raw(t *testing.T, m json.RawMessage) any {
	t.Helper()
	v, err := ParseJSON(string(m))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var checks int

func eq(t *testing.T, what string, got, want any) {
	t.Helper()
	checks++
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

func TestCanonicalJSON(t *testing.T) {
	var v struct {
		Cases []struct {
			Name, InputJSON, CanonicalHex, Sha256 string
		}
		Errors []struct{ Name, InputJSON string }
	}
	var r struct {
		Cases []struct {
			Name         string `json:"name"`
			InputJSON    string `json:"input_json"`
			CanonicalHex string `json:"canonical_hex"`
			Sha256       string `json:"sha256"`
		} `json:"cases"`
		Errors []struct {
			Name      string `json:"name"`
			InputJSON string `json:"input_json"`
		} `json:"errors"`
	}
	_ = v
	load(t, "canonical-json.json", &r)
	for _, c := range r.Cases {
		out, err := CanonicalText(c.InputJSON)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		eq(t, c.Name, hex.EncodeToString(out), c.CanonicalHex)
		eq(t, c.Name+" sha256", Sha256Hex(out), c.Sha256)
	}
	for _, c := range r.Errors {
		checks++
		if out, err := CanonicalText(c.InputJSON); err == nil {
			t.Errorf("%s: accepted as %s", c.Name, out)
		}
	}
	// section 3's other spellings of a number beyond a double
	for _, s := range []string{"[-1E+309]", "[1.797693134862315808e308]", "[2" + strings.Repeat("0", 308) + ".5]",
		"[1" + strings.Repeat("0", 4300) + "e-4200]"} {
		checks++
		if _, err := CanonicalText(s); err == nil {
			t.Errorf("accepted %.40s", s)
		}
	}
	for in, want := range map[string]string{"[1.7976931348623157e308]": "[1.7976931348623157e+308]", "[1e-400]": "[0.0]"} {
		out, err := CanonicalText(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
		}
		eq(t, in, string(out), want)
	}
}

func TestPartitionKeys(t *testing.T) {
	var r struct {
		Cases []struct {
			Name  string `json:"name"`
			Event struct {
				ConversationID *string `json:"conversation_id"`
				ChainRootID    *string `json:"chain_root_id"`
				ResponseID     string  `json:"response_id"`
			} `json:"event"`
			Key       string `json:"key"`
			KeyHex    string `json:"key_hex"`
			CRC32     uint32 `json:"crc32"`
			Partition int    `json:"partition_of_12"`
		} `json:"cases"`
	}
	load(t, "partition-keys.json", &r)
	for _, c := range r.Cases {
		k := PartitionKey(c.Event.ConversationID, c.Event.ChainRootID, c.Event.ResponseID)
		eq(t, c.Name+" key", k, c.Key)
		eq(t, c.Name+" key hex", hex.EncodeToString([]byte(k)), c.KeyHex)
		eq(t, c.Name+" partition", Partition([]byte(k), 12), c.Partition)
	}
}

func TestRequestDigests(t *testing.T) {
	var r struct {
		Cases []struct {
			Request       json.RawMessage `json:"request"`
			Canonical     string          `json:"canonical"`
			RequestDigest string          `json:"request_digest"`
		} `json:"cases"`
	}
	load(t, "request-digests.json", &r)
	for i, c := range r.Cases {
		out := MustCanonical(raw(t, c.Request))
		eq(t, fmt.Sprint("request ", i), string(out), c.Canonical)
		eq(t, fmt.Sprint("request digest ", i), Sha256Hex(out), c.RequestDigest)
	}
}

func TestItems(t *testing.T) {
	var r struct {
		Cases []struct {
			Object        json.RawMessage `json:"object"`
			ContentHex    string          `json:"content_hex"`
			ContentDigest string          `json:"content_digest"`
			Item          struct {
				ItemID string  `json:"item_id"`
				Type   string  `json:"type"`
				Role   *string `json:"role"`
				CallID *string `json:"call_id"`
			} `json:"item"`
		} `json:"cases"`
	}
	load(t, "items.json", &r)
	for _, c := range r.Cases {
		it, err := NewItem(raw(t, c.Object).(*Obj))
		if err != nil {
			t.Fatal(err)
		}
		eq(t, it.ItemID+" content", hex.EncodeToString(it.Content), c.ContentHex)
		eq(t, it.ItemID+" digest", it.ContentDigest, c.ContentDigest)
		eq(t, it.ItemID+" fields", []any{it.ItemID, it.Type, sp(it.Role), sp(it.CallID)},
			[]any{c.Item.ItemID, c.Item.Type, sp(c.Item.Role), sp(c.Item.CallID)})
	}
}

func TestFingerprints(t *testing.T) {
	var r struct {
		Cases []struct {
			Name            string          `json:"name"`
			Fingerprint     json.RawMessage `json:"fingerprint"`
			Canonical       string          `json:"canonical"`
			FingerprintHash string          `json:"fingerprint_hash"`
		} `json:"cases"`
		Recipes struct {
			Instructions []struct{ Instructions, Digest string } `json:"instructions_digest"`
			Template     []struct {
				ChatTemplate string `json:"chat_template"`
				Digest       string
			} `json:"chat_template_digest"`
			Tools []struct {
				Tools     json.RawMessage
				Sanitized json.RawMessage
				Digest    string
			} `json:"tools_digest"`
			Salt []struct {
				CacheSalt string `json:"cache_salt"`
				Digest    string
			} `json:"cache_salt_digest"`
			JSONText []struct {
				InputJSON string `json:"input_json"`
				Component string
			} `json:"json_text_components"`
		} `json:"component_recipes"`
	}
	load(t, "fingerprints.json", &r)
	for _, c := range r.Cases {
		fp := Fingerprint{}
		fromJSON(t, raw(t, c.Fingerprint), reflect.ValueOf(&fp).Elem())
		eq(t, c.Name+" hash", fp.Hash(), c.FingerprintHash)
		// and straight from the parsed object
		o := raw(t, c.Fingerprint).(*Obj)
		eq(t, c.Name+" canonical", string(MustCanonical(o)), c.Canonical)
	}
	for _, c := range r.Recipes.Instructions {
		eq(t, "instructions", Sha256Hex([]byte(c.Instructions)), c.Digest)
	}
	for _, c := range r.Recipes.Template {
		eq(t, "template", Sha256Hex([]byte(c.ChatTemplate)), c.Digest)
	}
	for _, c := range r.Recipes.Tools {
		tools := raw(t, c.Tools).([]any)
		eq(t, "tools sanitized", string(MustCanonical(SanitizeTools(tools))), string(MustCanonical(raw(t, c.Sanitized))))
		eq(t, "tools digest", ToolsDigest(tools), c.Digest)
	}
	for _, c := range r.Recipes.Salt {
		eq(t, "cache salt", CacheSaltDigest(c.CacheSalt), c.Digest)
	}
	for _, c := range r.Recipes.JSONText {
		out, _ := CanonicalText(c.InputJSON)
		eq(t, "json text component", string(out), c.Component)
	}
}

func TestEffectIDs(t *testing.T) {
	var r struct {
		EffectIDs []struct {
			IdempotencyKey string `json:"idempotency_key"`
			SubturnIndex   int    `json:"subturn_index"`
			CallID         string `json:"call_id"`
			EffectID       string `json:"effect_id"`
		} `json:"effect_ids"`
		ArgumentsDigests []struct {
			Arguments       string `json:"arguments"`
			ArgumentsDigest string `json:"arguments_digest"`
		} `json:"arguments_digests"`
		Claimed []struct {
			IdempotencyKey string `json:"idempotency_key"`
			SubturnIndex   int    `json:"subturn_index"`
			ToolName       string `json:"tool_name"`
			Occurrence     int    `json:"occurrence"`
			EffectID       string `json:"effect_id"`
		} `json:"claimed_effect_ids"`
		Calls []struct {
			Call            json.RawMessage `json:"call"`
			ArgumentsDigest string          `json:"arguments_digest"`
		} `json:"call_arguments_digests"`
	}
	load(t, "effect-ids.json", &r)
	for _, c := range r.EffectIDs {
		eq(t, "effect id", EffectID(c.IdempotencyKey, c.SubturnIndex, c.CallID), c.EffectID)
	}
	for _, c := range r.Claimed {
		eq(t, "claimed effect id", ClaimedEffectID(c.IdempotencyKey, c.SubturnIndex, c.ToolName, c.Occurrence), c.EffectID)
	}
	for _, c := range r.ArgumentsDigests {
		eq(t, "arguments "+c.Arguments, ArgumentsDigest(c.Arguments, true), c.ArgumentsDigest)
	}
	for _, c := range r.Calls {
		eq(t, "call "+string(c.Call), CallArgumentsDigest(raw(t, c.Call).(*Obj)), c.ArgumentsDigest)
	}
}

// fromJSON fills an avro-tagged struct from a parsed vector value (timestamps are
// epoch milliseconds, bytes their UTF-8 text).
func fromJSON(t *testing.T, v any, dst reflect.Value) {
	t.Helper()
	if v == nil {
		dst.Set(reflect.Zero(dst.Type()))
		return
	}
	if dst.Kind() == reflect.Pointer {
		p := reflect.New(dst.Type().Elem())
		fromJSON(t, v, p.Elem())
		dst.Set(p)
		return
	}
	switch dst.Interface().(type) {
	case time.Time:
		var ms int64
		fmt.Sscan(string(v.(Number)), &ms)
		dst.Set(reflect.ValueOf(time.UnixMilli(ms).UTC()))
		return
	case []byte:
		dst.SetBytes([]byte(v.(string)))
		return
	}
	switch dst.Kind() {
	case reflect.Struct:
		o := v.(*Obj)
		for i := 0; i < dst.NumField(); i++ {
			tag := dst.Type().Field(i).Tag.Get("avro")
			fv, ok := o.Vals[tag]
			if !ok {
				t.Fatalf("vector lacks %s", tag)
			}
			fromJSON(t, fv, dst.Field(i))
		}
	case reflect.Slice:
		a := v.([]any)
		s := reflect.MakeSlice(dst.Type(), len(a), len(a))
		for i, x := range a {
			fromJSON(t, x, s.Index(i))
		}
		dst.Set(s)
	case reflect.String:
		dst.SetString(v.(string))
	case reflect.Bool:
		dst.SetBool(v.(bool))
	case reflect.Int, reflect.Int64:
		var n int64
		fmt.Sscan(string(v.(Number)), &n)
		dst.SetInt(n)
	default:
		t.Fatalf("cannot fill %s", dst.Type())
	}
}

func TestEvents(t *testing.T) {
	var r struct {
		Cases []struct {
			Record       string          `json:"record"`
			SchemaSha256 string          `json:"schema_sha256"`
			Key          string          `json:"key"`
			Value        json.RawMessage `json:"value"`
			AvroBodyHex  string          `json:"avro_body_hex"`
			Wire42       string          `json:"wire_value_hex_if_schema_id_is_42"`
		} `json:"cases"`
	}
	load(t, "events.json", &r)
	reg := NewRegistry(registryURL())
	for _, c := range r.Cases {
		ws, err := reg.Latest(c.Record)
		if err != nil {
			t.Skipf("registry: %v", err)
		}
		eq(t, c.Record+" schema sha256", Sha256Hex([]byte(ws.Text)), c.SchemaSha256)
		var ev any
		switch c.Record {
		case "TurnCompleted":
			ev = &TurnCompleted{}
		case "ToolEffect":
			ev = &ToolEffect{}
		case "TurnCancelled":
			ev = &TurnCancelled{}
		}
		fromJSON(t, raw(t, c.Value), reflect.ValueOf(ev).Elem())
		body, err := avroAPI.Marshal(ws.Schema, ev)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, c.Record+" avro body", hex.EncodeToString(body), c.AvroBodyHex)
		eq(t, c.Record+" wire value (id 42)", hex.EncodeToString(Frame(42, body)), c.Wire42)
		var key string
		switch e := ev.(type) {
		case *TurnCompleted:
			key = e.Key()
			// the turn's own digests, recomputed
			eq(t, "fingerprint_hash", e.Fingerprint.Hash(), e.FingerprintHash)
			for _, it := range append(append([]AvroItem{}, e.InputItems...), e.OutputItems...) {
				eq(t, it.ItemID+" digest", Sha256Hex(it.Content), it.ContentDigest)
			}
		case *ToolEffect:
			key = e.Key()
		case *TurnCancelled:
			key = e.Key()
		}
		eq(t, c.Record+" key", key, c.Key)
	}
	t.Logf("%d vector checks so far", checks)
}

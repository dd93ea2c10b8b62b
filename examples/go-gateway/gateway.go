package main

// The live gateway: produce events (franz-go, CRC-32 partitioner), watch ratchet's
// outcome topics, and talk to the HTTP API.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
)

// MaxEventBytes: docs/gateway-protocol.md "Size limit" (5-byte header + body).
var sinceWindow = 2 * time.Second

const MaxEventBytes = 10 * 1024 * 1024

var ErrEventTooLarge = errors.New("event above the size limit")

type Gateway struct {
	Prefix  string
	API     string
	Reg     *Registry
	schemas map[string]*WriterSchema
	prod    *kgo.Client
	cons    *kgo.Client
	HTTP    *http.Client

	mu      sync.Mutex
	cond    *sync.Cond
	outputs []Output
}

// Output is one record ratchet published.
type Output struct {
	Topic     string
	Key       string
	Partition int32
	Value     map[string]any
	used      bool
}

func NewGateway(ctx context.Context) (*Gateway, error) {
	g := &Gateway{
		Prefix:  env("RATCHET_TOPIC_PREFIX", "ratchet."),
		API:     "http://127.0.0.1:" + env("RATCHET_API_PORT", "8080"),
		Reg:     NewRegistry(registryURL()),
		schemas: map[string]*WriterSchema{},
		HTTP:    &http.Client{Timeout: 30 * time.Second},
	}
	g.cond = sync.NewCond(&g.mu)
	for _, r := range []string{"TurnCompleted", "ToolEffect", "TurnCancelled"} {
		ws, err := g.Reg.Latest(r)
		if err != nil {
			return nil, err
		}
		g.schemas[r] = ws
	}
	seeds := kgo.SeedBrokers(env("RATCHET_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
	var err error
	g.prod, err = kgo.NewClient(seeds,
		// librdkafka's default: CRC-32 of the key, unsigned, mod the partition count.
		kgo.RecordPartitioner(kgo.BasicConsistentPartitioner(func(string) func(*kgo.Record, int) int {
			return func(r *kgo.Record, n int) int { return Partition(r.Key, n) }
		})),
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence is franz-go's default
		kgo.ProducerBatchMaxBytes(16*1024*1024),
		kgo.ProducerLinger(0),
		// franz-go never creates topics unless kgo.AllowAutoTopicCreation() is given.
	)
	if err != nil {
		return nil, err
	}
	since := time.Now().Add(-sinceWindow).UnixMilli()
	g.cons, err = kgo.NewClient(seeds,
		kgo.ConsumeTopics(g.Prefix+"checkpoints", g.Prefix+"rejections", g.Prefix+"orphaned-effects", g.Prefix+"dead-letters"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(since)),
		kgo.FetchMaxBytes(64*1024*1024),
	)
	if err != nil {
		return nil, err
	}
	go g.consume(ctx)
	return g, nil
}

func (g *Gateway) consume(ctx context.Context) {
	for ctx.Err() == nil {
		fs := g.cons.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			v, err := g.Reg.Decode(r.Value)
			if err != nil {
				v = map[string]any{"_decode_error": err.Error()}
			}
			g.mu.Lock()
			g.outputs = append(g.outputs, Output{Topic: r.Topic[len(g.Prefix):], Key: string(r.Key), Partition: r.Partition, Value: norm(v).(map[string]any)})
			g.cond.Broadcast()
			g.mu.Unlock()
		})
	}
}

// norm unwraps hamba's union maps ({"string": "x"} → "x").
func norm(v any) any {
	switch t := v.(type) {
	case map[string]any:
		if len(t) == 1 {
			for k, x := range t {
				if k == "string" || k == "long" || k == "int" || k == "boolean" || k == "bytes" ||
					k == "long.timestamp-millis" || len(k) > 11 && k[:11] == "io.ratchet." {
					return norm(x)
				}
			}
		}
		m := map[string]any{}
		for k, x := range t {
			m[k] = norm(x)
		}
		return m
	case []any:
		for i := range t {
			t[i] = norm(t[i])
		}
	}
	return v
}

// Wait returns the first output of topic matching pred, waiting up to d.
func (g *Gateway) Wait(topic string, d time.Duration, pred func(map[string]any) bool) (map[string]any, bool) {
	deadline := time.Now().Add(d)
	go func() { time.Sleep(d); g.mu.Lock(); g.cond.Broadcast(); g.mu.Unlock() }()
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		for _, o := range g.outputs {
			if o.Topic == topic && pred(o.Value) {
				return o.Value, true
			}
		}
		if time.Now().After(deadline) {
			return nil, false
		}
		g.cond.Wait()
	}
}

// Decision waits for the first outcome (checkpoints or rejections) of a response id
// not yet taken by an earlier call: an outcome's event_id is derived from the input
// event's by a recipe the docs do not give, so outcomes are matched by tenant and
// response id, in the order they were published.
func (g *Gateway) Decision(tenant, responseID string, d time.Duration) (string, map[string]any) {
	deadline := time.Now().Add(d)
	go func() { time.Sleep(d); g.mu.Lock(); g.cond.Broadcast(); g.mu.Unlock() }()
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		for i := range g.outputs {
			o := &g.outputs[i]
			if !o.used && (o.Topic == "checkpoints" || o.Topic == "rejections") &&
				o.Value["response_id"] == responseID && o.Value["tenant_id"] == tenant {
				o.used = true
				return o.Topic, o.Value
			}
		}
		if time.Now().After(deadline) {
			return "", nil
		}
		g.cond.Wait()
	}
}

// All returns every output of topic matching pred seen so far.
func (g *Gateway) All(topic string, pred func(map[string]any) bool) []map[string]any {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []map[string]any
	for _, o := range g.outputs {
		if o.Topic == topic && pred(o.Value) {
			out = append(out, o.Value)
		}
	}
	return out
}

func field(k string, want any) func(map[string]any) bool {
	return func(m map[string]any) bool { return fmt.Sprint(m[k]) == fmt.Sprint(want) }
}

func and(ps ...func(map[string]any) bool) func(map[string]any) bool {
	return func(m map[string]any) bool {
		for _, p := range ps {
			if !p(m) {
				return false
			}
		}
		return true
	}
}

// Encode frames an event with its record's registry id; refuses one above the limit.
func (g *Gateway) Encode(record string, ev any) ([]byte, error) {
	ws := g.schemas[record]
	body, err := avroAPI.Marshal(ws.Schema, ev)
	if err != nil {
		return nil, err
	}
	v := Frame(ws.ID, body)
	if len(v) > MaxEventBytes {
		return nil, fmt.Errorf("%w: %d bytes > %d", ErrEventTooLarge, len(v), MaxEventBytes)
	}
	return v, nil
}

// ProduceRaw sends a value as it is, returning partition and offset.
func (g *Gateway) ProduceRaw(ctx context.Context, key string, value []byte) (int32, int64, error) {
	r := &kgo.Record{Topic: g.Prefix + "gateway-events", Key: []byte(key), Value: value}
	res := g.prod.ProduceSync(ctx, r)
	if err := res.FirstErr(); err != nil {
		return 0, 0, err
	}
	return r.Partition, r.Offset, nil
}

func (g *Gateway) SendTurn(ctx context.Context, t *TurnCompleted) error {
	v, err := g.Encode("TurnCompleted", t)
	if err != nil {
		return err
	}
	_, _, err = g.ProduceRaw(ctx, t.Key(), v)
	return err
}

func (g *Gateway) SendEffect(ctx context.Context, e *ToolEffect) error {
	v, err := g.Encode("ToolEffect", e)
	if err != nil {
		return err
	}
	_, _, err = g.ProduceRaw(ctx, e.Key(), v)
	return err
}

func (g *Gateway) SendCancel(ctx context.Context, c *TurnCancelled) error {
	v, err := g.Encode("TurnCancelled", c)
	if err != nil {
		return err
	}
	_, _, err = g.ProduceRaw(ctx, c.Key(), v)
	return err
}

// HTTP

type Answer struct {
	Code int
	Body map[string]any
	Raw  string
}

func (a Answer) S(k string) string {
	if a.Body == nil || a.Body[k] == nil {
		return ""
	}
	return fmt.Sprint(a.Body[k])
}

func (g *Gateway) do(method, path string, q url.Values, body any) Answer {
	u := g.API + path
	if q != nil {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, u, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := g.HTTP.Do(req)
	if err != nil {
		return Answer{Code: -1, Raw: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := Answer{Code: resp.StatusCode, Raw: string(b)}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	_ = dec.Decode(&a.Body)
	return a
}

func (g *Gateway) ResponseHistory(tenant, resp, fp string, waitMs int) Answer {
	q := url.Values{"tenant_id": {tenant}, "fingerprint_hash": {fp}}
	if waitMs > 0 {
		q.Set("wait_ms", fmt.Sprint(waitMs))
	}
	return g.do("GET", "/v1/responses/"+resp+"/history", q, nil)
}

func (g *Gateway) ConversationHistory(tenant, conv, fp string) Answer {
	return g.do("GET", "/v1/conversations/"+conv+"/history", url.Values{"tenant_id": {tenant}, "fingerprint_hash": {fp}}, nil)
}

func (g *Gateway) Status(tenant, resp string) Answer {
	return g.do("GET", "/v1/responses/"+resp+"/status", url.Values{"tenant_id": {tenant}}, nil)
}

func (g *Gateway) Claim(req map[string]any) Answer {
	return g.do("POST", "/v1/effects/claims", nil, req)
}

func (g *Gateway) Complete(effectID string, req map[string]any) Answer {
	return g.do("POST", "/v1/effects/claims/"+effectID+"/complete", nil, req)
}

func NewID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func UUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

var _ = avro.Parse

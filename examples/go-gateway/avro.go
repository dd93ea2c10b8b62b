package main

// Confluent wire format (docs/gateway-protocol.md section 2) over hamba/avro, with the
// schema registry spoken to in plain HTTP (three GETs; no client library needed).

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/hamba/avro/v2"
)

// The vectors' bytes are written without the array block-size header.
var avroAPI = avro.Config{DisableBlockSizeHeader: true}.Freeze()

type Registry struct {
	URL   string
	HTTP  *http.Client
	mu    sync.Mutex
	byID  map[int]avro.Schema
	texts map[int]string
}

func NewRegistry(url string) *Registry {
	return &Registry{URL: url, HTTP: &http.Client{Timeout: 10 * time.Second},
		byID: map[int]avro.Schema{}, texts: map[int]string{}}
}

func (r *Registry) getJSON(path string, out any) error {
	resp, err := r.HTTP.Get(r.URL + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("registry %s: HTTP %d: %s", path, resp.StatusCode, body)
	}
	return json.Unmarshal(body, out)
}

// WriterSchema is a record's latest schema: its text, id and parsed form.
type WriterSchema struct {
	ID     int
	Text   string
	Schema avro.Schema
}

func (r *Registry) Latest(record string) (*WriterSchema, error) {
	var v struct {
		ID     int    `json:"id"`
		Schema string `json:"schema"`
	}
	if err := r.getJSON("/subjects/io.ratchet."+record+"/versions/latest", &v); err != nil {
		return nil, err
	}
	s, err := avro.ParseWithCache(v.Schema, "", &avro.SchemaCache{})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.byID[v.ID], r.texts[v.ID] = s, v.Schema
	r.mu.Unlock()
	return &WriterSchema{ID: v.ID, Text: v.Schema, Schema: s}, nil
}

func (r *Registry) ByID(id int) (avro.Schema, error) {
	r.mu.Lock()
	s, ok := r.byID[id]
	r.mu.Unlock()
	if ok {
		return s, nil
	}
	var v struct {
		Schema string `json:"schema"`
	}
	if err := r.getJSON(fmt.Sprintf("/schemas/ids/%d", id), &v); err != nil {
		return nil, err
	}
	s, err := avro.ParseWithCache(v.Schema, "", &avro.SchemaCache{})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.byID[id] = s
	r.mu.Unlock()
	return s, nil
}

// Frame writes 0x00, the 4-byte big-endian id, then the body.
func Frame(id int, body []byte) []byte {
	out := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(out[1:5], uint32(id))
	return append(out, body...)
}

// Decode reads a framed value with the writer schema its id names.
func (r *Registry) Decode(value []byte) (map[string]any, error) {
	if len(value) < 5 || value[0] != 0 {
		return nil, errors.New("not Confluent-framed")
	}
	s, err := r.ByID(int(binary.BigEndian.Uint32(value[1:5])))
	if err != nil {
		return nil, err
	}
	var out map[string]any
	err = avroAPI.Unmarshal(s, value[5:], &out)
	return out, err
}

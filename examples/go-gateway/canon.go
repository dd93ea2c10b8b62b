package main

// Canonical JSON (docs/gateway-protocol.md section 3), written from the docs alone.
//
// encoding/json is not used to parse: it turns a lone surrogate escape into U+FFFD,
// keeps the last of two equal keys silently and has no way to keep 1.0 apart from 1
// except json.Number. This small parser keeps each number's text, refuses lone
// surrogates and reports duplicate keys; the encoder spells floats as Python's repr.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Number keeps the text of a JSON number as parsed (or as built by Int/Float below).
type Number string

// Obj is a JSON object with its members in input order (keys are checked for
// duplicates when parsed).
type Obj struct {
	Keys []string
	Vals map[string]any
}

// O builds an object from alternating key, value pairs.
func O(kv ...any) *Obj {
	o := &Obj{Vals: map[string]any{}}
	for i := 0; i+1 < len(kv); i += 2 {
		o.Set(kv[i].(string), kv[i+1])
	}
	return o
}

func (o *Obj) Set(k string, v any) {
	if _, ok := o.Vals[k]; !ok {
		o.Keys = append(o.Keys, k)
	}
	o.Vals[k] = v
}

func (o *Obj) Get(k string) (any, bool) { v, ok := o.Vals[k]; return v, ok }

var ErrDuplicateKey = errors.New("duplicate key")

const maxIntDigits = 4300
const maxDepth = 201

type parser struct {
	s     string
	i     int
	depth int
}

// ParseJSON parses strict JSON (RFC 8259) keeping number texts.
func ParseJSON(s string) (any, error) {
	if !utf8.ValidString(s) {
		return nil, errors.New("not UTF-8")
	}
	p := &parser{s: s}
	p.ws()
	v, err := p.value()
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.i != len(p.s) {
		return nil, fmt.Errorf("extra data at %d", p.i)
	}
	return v, nil
}

func (p *parser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) value() (any, error) {
	if p.i >= len(p.s) {
		return nil, errors.New("unexpected end")
	}
	switch c := p.s[p.i]; {
	case c == '{':
		p.depth++
		if p.depth > maxDepth {
			return nil, errors.New("nested too deep")
		}
		p.i++
		o := &Obj{Vals: map[string]any{}}
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == '}' {
			p.i++
			p.depth--
			return o, nil
		}
		for {
			p.ws()
			if p.i >= len(p.s) || p.s[p.i] != '"' {
				return nil, fmt.Errorf("key expected at %d", p.i)
			}
			k, err := p.str()
			if err != nil {
				return nil, err
			}
			p.ws()
			if p.i >= len(p.s) || p.s[p.i] != ':' {
				return nil, fmt.Errorf("':' expected at %d", p.i)
			}
			p.i++
			p.ws()
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			if _, dup := o.Vals[k]; dup {
				return nil, fmt.Errorf("%w %q", ErrDuplicateKey, k)
			}
			o.Set(k, v)
			p.ws()
			if p.i < len(p.s) && p.s[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.s) && p.s[p.i] == '}' {
				p.i++
				p.depth--
				return o, nil
			}
			return nil, fmt.Errorf("',' or '}' expected at %d", p.i)
		}
	case c == '[':
		p.depth++
		if p.depth > maxDepth {
			return nil, errors.New("nested too deep")
		}
		p.i++
		a := []any{}
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == ']' {
			p.i++
			p.depth--
			return a, nil
		}
		for {
			p.ws()
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			a = append(a, v)
			p.ws()
			if p.i < len(p.s) && p.s[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.s) && p.s[p.i] == ']' {
				p.i++
				p.depth--
				return a, nil
			}
			return nil, fmt.Errorf("',' or ']' expected at %d", p.i)
		}
	case c == '"':
		return p.str()
	case c == 't' && strings.HasPrefix(p.s[p.i:], "true"):
		p.i += 4
		return true, nil
	case c == 'f' && strings.HasPrefix(p.s[p.i:], "false"):
		p.i += 5
		return false, nil
	case c == 'n' && strings.HasPrefix(p.s[p.i:], "null"):
		p.i += 4
		return nil, nil
	case c == '-' || (c >= '0' && c <= '9'):
		return p.num()
	}
	return nil, fmt.Errorf("unexpected %q at %d", p.s[p.i], p.i)
}

func (p *parser) num() (any, error) {
	st := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	ds := p.i
	if n := digits(); n == 0 {
		return nil, errors.New("bad number")
	}
	if p.s[ds] == '0' && p.i-ds > 1 {
		return nil, errors.New("leading zero")
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return nil, errors.New("bad fraction")
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return nil, errors.New("bad exponent")
		}
	}
	return Number(p.s[st:p.i]), nil
}

func hex4(s string) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	v, err := strconv.ParseUint(s[:4], 16, 32)
	return rune(v), err == nil
}

func (p *parser) str() (string, error) {
	p.i++ // opening quote
	var b strings.Builder
	for {
		if p.i >= len(p.s) {
			return "", errors.New("unterminated string")
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return b.String(), nil
		case c < 0x20:
			return "", errors.New("control character in string")
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return "", errors.New("bad escape")
			}
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, ok := hex4(p.s[p.i:])
				if !ok {
					return "", errors.New("bad \\u escape")
				}
				p.i += 4
				if utf16.IsSurrogate(r) {
					if r >= 0xDC00 || !strings.HasPrefix(p.s[p.i:], "\\u") {
						return "", errors.New("lone surrogate")
					}
					r2, ok := hex4(p.s[p.i+2:])
					if !ok || r2 < 0xDC00 || r2 > 0xDFFF {
						return "", errors.New("lone surrogate")
					}
					p.i += 6
					r = utf16.DecodeRune(r, r2)
				}
				b.WriteRune(r)
			default:
				return "", errors.New("bad escape")
			}
		default:
			b.WriteByte(c)
			p.i++
		}
	}
}

// Canonical encodes v canonically. Values: nil, bool, string, Number, int, int64,
// float64, *big.Int, *Obj, map[string]any, []any, []string.
func Canonical(v any) ([]byte, error) {
	var b strings.Builder
	if err := canon(&b, v); err != nil {
		return nil, err
	}
	return []byte(b.String()), nil
}

func MustCanonical(v any) []byte {
	out, err := Canonical(v)
	if err != nil {
		panic(err)
	}
	return out
}

func canonString(b *strings.Builder, s string) error {
	if !utf8.ValidString(s) {
		return errors.New("string not UTF-8")
	}
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else if utf16.IsSurrogate(r) {
				return errors.New("lone surrogate")
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return nil
}

func canonNumber(b *strings.Builder, n string) error {
	mant := strings.TrimPrefix(n, "-")
	intPart := mant
	if k := strings.IndexAny(mant, ".eE"); k >= 0 {
		intPart = mant[:k]
	}
	if len(intPart) > maxIntDigits {
		return errors.New("number with more than 4300 digits")
	}
	if !strings.ContainsAny(n, ".eE") {
		z, ok := new(big.Int).SetString(n, 10)
		if !ok {
			return errors.New("bad integer")
		}
		b.WriteString(z.String()) // -0 becomes 0
		return nil
	}
	f, err := strconv.ParseFloat(n, 64)
	if err != nil && !(errors.Is(err, strconv.ErrRange) && !math.IsInf(f, 0)) {
		return fmt.Errorf("number %s has no float spelling", n)
	}
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return fmt.Errorf("number %s has no float spelling", n)
	}
	b.WriteString(PyFloatRepr(f))
	return nil
}

// PyFloatRepr spells a double as Python's repr does.
func PyFloatRepr(f float64) string {
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	sign := ""
	if f < 0 {
		sign = "-"
		f = -f
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX, shortest round-trip
	k := strings.IndexByte(e, 'e')
	mant, exp := e[:k], e[k+1:]
	x, _ := strconv.Atoi(exp)
	digits := strings.Replace(mant, ".", "", 1)
	if x >= -4 && x < 16 {
		var s string
		if x >= 0 {
			if len(digits) <= x+1 {
				s = digits + strings.Repeat("0", x+1-len(digits)) + ".0"
			} else {
				s = digits[:x+1] + "." + digits[x+1:]
			}
		} else {
			s = "0." + strings.Repeat("0", -x-1) + digits
		}
		return sign + s
	}
	m := digits[:1]
	if len(digits) > 1 {
		m += "." + digits[1:]
	}
	es := "+"
	if x < 0 {
		es = "-"
		x = -x
	}
	return fmt.Sprintf("%s%se%s%02d", sign, m, es, x)
}

func canon(b *strings.Builder, v any) error {
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if t {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case string:
		return canonString(b, t)
	case Number:
		return canonNumber(b, string(t))
	case int:
		b.WriteString(strconv.Itoa(t))
	case int32:
		b.WriteString(strconv.FormatInt(int64(t), 10))
	case int64:
		b.WriteString(strconv.FormatInt(t, 10))
	case *big.Int:
		b.WriteString(t.String())
	case float64:
		if math.IsInf(t, 0) || math.IsNaN(t) {
			return errors.New("NaN or Infinity")
		}
		b.WriteString(PyFloatRepr(t))
	case []string:
		a := make([]any, len(t))
		for i, s := range t {
			a[i] = s
		}
		return canon(b, a)
	case []any:
		b.WriteByte('[')
		for i, x := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := canon(b, x); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		return canon(b, &Obj{Keys: keysOf(t), Vals: t})
	case *Obj:
		keys := append([]string(nil), t.Keys...)
		// Go compares strings bytewise: UTF-8 byte order is code point order.
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := canonString(b, k); err != nil {
				return err
			}
			b.WriteByte(':')
			if err := canon(b, t.Vals[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("no canonical form for %T", v)
	}
	return nil
}

func keysOf(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func Sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// CanonicalText parses JSON text and encodes it canonically.
func CanonicalText(s string) ([]byte, error) {
	v, err := ParseJSON(s)
	if err != nil {
		return nil, err
	}
	return Canonical(v)
}

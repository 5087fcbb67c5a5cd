package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/providers/env/v2"

	"github.com/turnguard/turnguard/messages"
)

// EnvPrefix starts every environment variable that overrides a key.
const EnvPrefix = "GATEWAY_"

// reservedEnv are GATEWAY_ variables read by the gateway's main, not
// configuration keys; the loader ignores them.
var reservedEnv = map[string]bool{
	"GATEWAY_LOG_FORMAT": true,
	"GATEWAY_LOG_LEVEL":  true,
}

// envReader maps GATEWAY_ variables onto configuration keys for koanf's env
// provider. The provider's transform callback cannot fail, so problems are
// collected and reported after the load, each naming the variable (never its
// value, which may be a secret).
type envReader struct {
	problems []Problem
	seen     map[string]string // key → the variable that set it
}

func newEnvReader() *envReader { return &envReader{seen: map[string]string{}} }

func (r *envReader) provider(environ []string) *env.Env {
	// Sorted, so that problems come out in the same order every time.
	vars := append([]string(nil), environ...)
	sort.Strings(vars)
	return env.Provider(".", env.Opt{
		Prefix:        EnvPrefix,
		TransformFunc: r.transform,
		EnvironFunc:   func() []string { return vars },
	})
}

func (r *envReader) transform(name, raw string) (string, any) {
	if reservedEnv[name] {
		return "", nil
	}
	key, v, err := envKeyValue(name, raw)
	if err != nil {
		r.problems = append(r.problems, Problem{Key: name, Text: "environment variable " + name + ": " + err.Error()})
		return "", nil
	}
	if prev, ok := r.seen[key]; ok {
		r.problems = append(r.problems, Problem{Key: name,
			Text: fmt.Sprintf("environment variables %s and %s both set %s", prev, name, key)})
		return "", nil
	}
	r.seen[key] = name
	return key, v
}

// envKeyValue resolves one variable: the key it names (segments separated by
// "__", matched case-insensitively, single underscores ignored) and its value
// converted to the key's type.
func envKeyValue(name, raw string) (string, any, error) {
	segs := strings.Split(strings.TrimPrefix(name, EnvPrefix), "__")
	n := rootSchema()
	for i, seg := range segs {
		last := i == len(segs)-1
		switch n.kind {
		case kindSection:
			c := n.childFold(seg)
			if c == nil {
				where := "the top level"
				if n.path != "" {
					where = n.path
				}
				return "", nil, fmt.Errorf("%q is not a key of %s", seg, where)
			}
			n = c
			if !last {
				continue
			}
			switch n.kind {
			case kindSection:
				return "", nil, fmt.Errorf("%s is a section; name one of its keys (%s__…)", n.path, name)
			case kindMap:
				return "", nil, fmt.Errorf("%s is a map; set one entry with %s__NAME", n.path, name)
			case kindList, kindFree:
				return "", nil, fmt.Errorf("%s cannot be set from the environment; use the YAML file", n.path)
			}
			v, err := envValue(n.typ, raw)
			if err != nil {
				return "", nil, fmt.Errorf("%s %w", n.path, err)
			}
			return n.path, v, nil
		case kindMap:
			if !last {
				return "", nil, fmt.Errorf("%s entries have no sub-keys", n.path)
			}
			entry := seg
			if n.path == "messages" {
				if entry = messageName(seg); entry == "" {
					return "", nil, fmt.Errorf("%q is not a message name (known: %s)", seg, knownMessages())
				}
			}
			if entry == "" {
				return "", nil, fmt.Errorf("empty entry name under %s", n.path)
			}
			return n.path + "." + entry, raw, nil
		case kindValue:
			return "", nil, fmt.Errorf("%s is a value and has no sub-keys", n.path)
		default:
			return "", nil, fmt.Errorf("%s cannot be set from the environment; use the YAML file", n.path)
		}
	}
	return "", nil, fmt.Errorf("names no key")
}

// envValue converts the text of a variable to a value of type t. Lists are
// comma separated; an empty value is an empty list, an empty string, or, for
// an optional number (a timeout key), "not set".
func envValue(t reflect.Type, raw string) (any, error) {
	s := strings.TrimSpace(raw)
	switch {
	case t.Kind() == reflect.Pointer:
		if s == "" {
			return nil, nil
		}
		return envValue(t.Elem(), raw)
	case t == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("must be a duration such as 90s or 10m")
		}
		return d, nil
	case t.Kind() == reflect.String:
		return raw, nil
	case t.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("must be true or false")
		}
		return b, nil
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		i, err := strconv.ParseInt(s, 10, t.Bits())
		if err != nil {
			return nil, fmt.Errorf("must be a whole number")
		}
		return i, nil
	case t.Kind() == reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("must be a number")
		}
		return f, nil
	case t.Kind() == reflect.Slice:
		out := []any{}
		if s == "" {
			return out, nil
		}
		for i, item := range strings.Split(s, ",") {
			v, err := envValue(t.Elem(), strings.TrimSpace(item))
			if err != nil {
				return nil, fmt.Errorf("item %d %w", i+1, err)
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("cannot be set from the environment")
}

// messageName returns the template name matching seg case-insensitively.
func messageName(seg string) string {
	for n := range messages.Defaults {
		if foldKey(string(n)) == foldKey(seg) {
			return string(n)
		}
	}
	return ""
}

func knownMessages() string {
	names := make([]string, 0, len(messages.Defaults))
	for n := range messages.Defaults {
		names = append(names, string(n))
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

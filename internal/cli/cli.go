// Package cli layers configuration for peer's subcommands: command-line
// flags win over STARLING_* environment variables, which win over a config
// file, which wins over the defaults.
package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

// EnvName returns the environment variable for a flag: STARLING_ and the
// flag name in upper case with '-' as '_' (--min-peers: STARLING_MIN_PEERS).
func EnvName(flagName string) string {
	return "STARLING_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Layer applies environment variables and then the config file at path
// (a JSON object of flag names to values; "" for none) to the flags of fs
// that the command line did not set. Call it after fs.Parse. An unknown
// key, an unreadable file or a bad value is an error naming its source.
func Layer(fs *flag.FlagSet, path string, env func(string) string) error {
	if env == nil {
		env = os.Getenv
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] || f.Name == "config" {
			return
		}
		if v := env(EnvName(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v", EnvName(f.Name), v, e)
				return
			}
			set[f.Name] = true
		}
	})
	if err != nil || path == "" {
		return err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var kv map[string]any
	if err := json.Unmarshal(b, &kv); err != nil {
		return fmt.Errorf("config file %s: not a JSON object of flag names to values: %v", path, err)
	}
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if fs.Lookup(k) == nil || k == "config" {
			return fmt.Errorf("config file %s: unknown setting %q", path, k)
		}
		if set[k] {
			continue
		}
		var v string
		switch x := kv[k].(type) {
		case string:
			v = x
		case bool, float64:
			v = fmt.Sprint(x)
		case []any:
			parts := make([]string, len(x))
			for i, p := range x {
				parts[i] = fmt.Sprint(p)
			}
			v = strings.Join(parts, ",")
		default:
			return fmt.Errorf("config file %s: %q: unsupported value %v", path, k, x)
		}
		if err := fs.Set(k, v); err != nil {
			return fmt.Errorf("config file %s: %q=%q: %v", path, k, v, err)
		}
	}
	return nil
}

// List is a flag.Value holding a comma-separated list.
type List []string

func (l *List) String() string { return strings.Join(*l, ",") }

// Set implements flag.Value; repeated flags accumulate.
func (l *List) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

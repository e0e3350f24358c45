// Compiles regular expressions with Go's regexp package (RE2 syntax, what Go's JSON Schema
// validators use) and runs them on sample strings, for test_schema_patterns.py.
//
//	go run regex_check.go SPEC_JSON
//
// SPEC_JSON: {"patterns": [...], "samples": [...]}. Prints one JSON report:
// {"compiled": {pattern: null | error}, "matches": {pattern: [bool per sample]}}; a pattern
// matches a sample when it matches anywhere in it, as JSON Schema's "pattern" does.
package main

import (
	"encoding/json"
	"os"
	"regexp"
)

type spec struct {
	Patterns []string `json:"patterns"`
	Samples  []string `json:"samples"`
}

type report struct {
	Compiled map[string]*string `json:"compiled"`
	Matches  map[string][]bool  `json:"matches"`
}

func main() {
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	var s spec
	if err := json.Unmarshal(raw, &s); err != nil {
		panic(err)
	}
	out := report{Compiled: map[string]*string{}, Matches: map[string][]bool{}}
	for _, p := range s.Patterns {
		re, err := regexp.Compile(p)
		if err != nil {
			msg := err.Error()
			out.Compiled[p] = &msg
			continue
		}
		out.Compiled[p] = nil
		got := make([]bool, len(s.Samples))
		for i, sample := range s.Samples {
			got[i] = re.MatchString(sample)
		}
		out.Matches[p] = got
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		panic(err)
	}
}

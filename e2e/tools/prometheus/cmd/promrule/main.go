// promrule: prints the `spec` of every PrometheusRule (monitoring.coreos.com/v1) in the YAML
// documents of the given files (or stdin) as one plain Prometheus rule file (`groups: [...]`), the
// form `promtool check rules` and `promtool test rules` read. Fails when no PrometheusRule is found.
//
// Usage: promrule [FILE...] > rules.yaml
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

type prometheusRule struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Spec       struct {
		Groups []yaml.Node `yaml:"groups"`
	} `yaml:"spec"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "promrule:", err)
		os.Exit(1)
	}
}

func run() error {
	var inputs [][]byte
	if len(os.Args) == 1 {
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		inputs = append(inputs, data)
	}
	for _, path := range os.Args[1:] {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		inputs = append(inputs, data)
	}
	var groups []yaml.Node
	found := 0
	for _, data := range inputs {
		decoder := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var doc prometheusRule
			err := decoder.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			if doc.Kind != "PrometheusRule" {
				continue
			}
			if doc.APIVersion != "monitoring.coreos.com/v1" {
				return fmt.Errorf("PrometheusRule with apiVersion %q, want monitoring.coreos.com/v1", doc.APIVersion)
			}
			found++
			groups = append(groups, doc.Spec.Groups...)
		}
	}
	if found == 0 {
		return errors.New("no PrometheusRule found")
	}
	out := yaml.NewEncoder(os.Stdout)
	out.SetIndent(2)
	defer out.Close()
	return out.Encode(map[string][]yaml.Node{"groups": groups})
}

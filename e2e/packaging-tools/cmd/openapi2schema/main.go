// Command openapi2schema writes the JSON schemas kubeconform validates manifests against, in
// kubeconform's file layout (`{kind}-{group prefix}-{version}.json`, all lower case; the group is left
// out for the core group), without any network access:
//
//	openapi2schema openapi -in openapi-v2.json -out DIR [-only LIST]  # kinds a kube-apiserver serves
//	openapi2schema crd -out DIR crds/*.yaml                           # kinds of CustomResourceDefinitions
//
// LIST is a file naming the schema files to write, one per line (`#` starts a comment); without it
// every kind is written.
//
// The schemas are standalone (no reference outside the file: the definitions a kind needs are copied
// into its file under "definitions", so recursive types such as JSONSchemaProps stay finite) and
// strict (`additionalProperties: false` on every object that lists its properties, so a misspelt or
// misplaced field fails validation). Quantity and IntOrString accept what the API server accepts
// (a string or a number). Output is deterministic: sorted keys, one-space indentation.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

const definitionsPrefix = "#/definitions/"

// Definitions whose OpenAPI v2 form ("type: string") is narrower than what the API server decodes.
var overrides = map[string]map[string]any{
	"io.k8s.apimachinery.pkg.api.resource.Quantity": {
		"description": "A resource quantity such as 500m, 2Gi or 1 (a string or a number).",
		"oneOf":       []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}},
	},
	"io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
		"description": "An int32 or a string.",
		"oneOf":       []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}},
	},
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "openapi":
		err = runOpenAPI(os.Args[2:])
	case "crd":
		err = runCRD(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "openapi2schema: %v\n", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: openapi2schema openapi -in openapi-v2.json -out DIR\n       openapi2schema crd -out DIR FILE.yaml...")
	os.Exit(2)
}

// fileName is kubeconform's `{{ .ResourceKind }}{{ .KindSuffix }}.json` for a group/version/kind.
func fileName(group, version, kind string) string {
	name := strings.ToLower(kind)
	if group != "" {
		name += "-" + strings.ToLower(strings.Split(group, ".")[0])
	}
	return name + "-" + strings.ToLower(version) + ".json"
}

func runOpenAPI(args []string) error {
	flags := flag.NewFlagSet("openapi", flag.ContinueOnError)
	in := flags.String("in", "", "OpenAPI v2 document (a kube-apiserver's /openapi/v2)")
	out := flags.String("out", "", "output directory")
	only := flags.String("only", "", "file listing the schema files to write (default: all)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *in == "" || *out == "" {
		return errors.New("openapi needs -in and -out")
	}
	wanted, err := readList(*only)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	var document struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(raw, &document); err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	if len(document.Definitions) == 0 {
		return fmt.Errorf("%s has no definitions: not an OpenAPI v2 document", *in)
	}
	names := make([]string, 0, len(document.Definitions))
	for name := range document.Definitions {
		names = append(names, name)
	}
	sort.Strings(names)
	written := map[string]string{} // file -> definition
	for _, name := range names {
		definition := document.Definitions[name]
		gvks, _ := definition["x-kubernetes-group-version-kind"].([]any)
		for _, entry := range gvks {
			gvk, _ := entry.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			if kind == "" || version == "" {
				continue
			}
			file := fileName(group, version, kind)
			if previous, taken := written[file]; taken {
				// Two groups sharing a first label would share a file name; never pick one silently.
				return fmt.Errorf("%s: both %s and %s map to it", file, previous, name)
			}
			written[file] = name
			if wanted != nil && !wanted[file] {
				continue
			}
			schema, err := standalone(name, document.Definitions)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := writeJSON(filepath.Join(*out, file), schema); err != nil {
				return err
			}
		}
	}
	count := len(written)
	if wanted != nil {
		var unknown []string
		for file := range wanted {
			if _, ok := written[file]; !ok {
				unknown = append(unknown, file)
			}
		}
		if len(unknown) > 0 {
			sort.Strings(unknown)
			return fmt.Errorf("%s names schemas that %s serves no kind for: %v", *only, *in, unknown)
		}
		count = len(wanted)
	}
	fmt.Fprintf(os.Stderr, "openapi2schema: %d schemas from %s into %s\n", count, *in, *out)
	return nil
}

// readList reads a list of file names (one per line, `#` comments); nil when path is empty.
func readList(path string) (map[string]bool, error) {
	if path == "" {
		return nil, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	wanted := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		if hash := strings.IndexByte(line, '#'); hash >= 0 {
			line = line[:hash]
		}
		if line = strings.TrimSpace(line); line != "" {
			wanted[line] = true
		}
	}
	return wanted, nil
}

// standalone converts definition `root` and copies every definition it references into "definitions".
func standalone(root string, definitions map[string]map[string]any) (map[string]any, error) {
	needed := map[string]bool{}
	var missing []string
	var visit func(node any)
	visit = func(node any) {
		switch value := node.(type) {
		case map[string]any:
			if ref, ok := value["$ref"].(string); ok && strings.HasPrefix(ref, definitionsPrefix) {
				name := strings.TrimPrefix(ref, definitionsPrefix)
				if !needed[name] {
					needed[name] = true
					if definition, ok := definitions[name]; ok {
						if _, overridden := overrides[name]; !overridden {
							visit(definition)
						}
					} else {
						missing = append(missing, name)
					}
				}
			}
			for key, child := range value {
				if key == "properties" {
					// Property names are data, not keywords (JSONSchemaProps has a property named "$ref").
					if properties, ok := child.(map[string]any); ok {
						for _, property := range properties {
							visit(property)
						}
					}
					continue
				}
				visit(child)
			}
		case []any:
			for _, child := range value {
				visit(child)
			}
		}
	}
	visit(definitions[root])
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("references missing definitions %v", missing)
	}
	schema := strictOpenAPI(definitions[root]).(map[string]any)
	delete(schema, "x-kubernetes-group-version-kind")
	if len(needed) > 0 {
		copied := map[string]any{}
		for name := range needed {
			if override, ok := overrides[name]; ok {
				copied[name] = override
			} else {
				copied[name] = strictOpenAPI(definitions[name])
			}
		}
		schema["definitions"] = copied
	}
	return schema, nil
}

// strictOpenAPI copies an OpenAPI v2 schema, closing every object that lists its properties.
func strictOpenAPI(node any) any {
	switch value := node.(type) {
	case map[string]any:
		out := map[string]any{}
		for key, child := range value {
			switch key {
			case "properties":
				properties := map[string]any{}
				for name, property := range child.(map[string]any) {
					properties[name] = strictOpenAPI(property)
				}
				out[key] = properties
			case "x-kubernetes-group-version-kind":
				// Not a schema keyword; dropped from copied definitions too.
			default:
				out[key] = strictOpenAPI(child)
			}
		}
		if _, ok := out["properties"]; ok {
			if _, set := out["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
		}
		return out
	case []any:
		out := make([]any, len(value))
		for i, child := range value {
			out[i] = strictOpenAPI(child)
		}
		return out
	default:
		return value
	}
}

func runCRD(args []string) error {
	flags := flag.NewFlagSet("crd", flag.ContinueOnError)
	out := flags.String("out", "", "output directory")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *out == "" || flags.NArg() == 0 {
		return errors.New("crd needs -out and at least one CRD file")
	}
	count := 0
	for _, path := range flags.Args() {
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		documents, err := splitYAML(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, document := range documents {
			var crd struct {
				Kind string `json:"kind"`
				Spec struct {
					Group string `json:"group"`
					Names struct {
						Kind string `json:"kind"`
					} `json:"names"`
					Versions []struct {
						Name   string `json:"name"`
						Schema struct {
							OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
						} `json:"schema"`
					} `json:"versions"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal(document, &crd); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if crd.Kind != "CustomResourceDefinition" {
				return fmt.Errorf("%s: a %q, not a CustomResourceDefinition", path, crd.Kind)
			}
			for _, version := range crd.Spec.Versions {
				if version.Schema.OpenAPIV3Schema == nil {
					return fmt.Errorf("%s: version %s has no openAPIV3Schema", path, version.Name)
				}
				schema := strictStructural(version.Schema.OpenAPIV3Schema).(map[string]any)
				// The API server adds these to every custom resource; the CRD schema need not list them.
				properties, _ := schema["properties"].(map[string]any)
				if properties == nil {
					properties = map[string]any{}
					schema["properties"] = properties
				}
				for _, field := range []string{"apiVersion", "kind"} {
					if _, ok := properties[field]; !ok {
						properties[field] = map[string]any{"type": "string"}
					}
				}
				if _, ok := properties["metadata"]; !ok {
					properties["metadata"] = map[string]any{"type": "object"}
				}
				schema["additionalProperties"] = false
				file := fileName(crd.Spec.Group, version.Name, crd.Spec.Names.Kind)
				if err := writeJSON(filepath.Join(*out, file), schema); err != nil {
					return err
				}
				count++
			}
		}
	}
	fmt.Fprintf(os.Stderr, "openapi2schema: %d CRD schemas into %s\n", count, *out)
	return nil
}

// strictStructural copies a CRD structural schema into plain JSON Schema: int-or-string becomes
// "string or integer", nullable adds "null", and objects with properties are closed unless they
// preserve unknown fields.
func strictStructural(node any) any {
	switch value := node.(type) {
	case map[string]any:
		out := map[string]any{}
		for key, child := range value {
			if key == "properties" {
				properties := map[string]any{}
				for name, property := range child.(map[string]any) {
					properties[name] = strictStructural(property)
				}
				out[key] = properties
				continue
			}
			out[key] = strictStructural(child)
		}
		if intOrString, _ := out["x-kubernetes-int-or-string"].(bool); intOrString {
			delete(out, "type")
			_, hasAnyOf := out["anyOf"]
			_, hasOneOf := out["oneOf"]
			if !hasAnyOf && !hasOneOf {
				out["anyOf"] = []any{map[string]any{"type": "integer"}, map[string]any{"type": "string"}}
			}
		}
		if nullable, _ := out["nullable"].(bool); nullable {
			if kind, ok := out["type"].(string); ok {
				out["type"] = []any{kind, "null"}
			}
		}
		preserve, _ := out["x-kubernetes-preserve-unknown-fields"].(bool)
		if _, ok := out["properties"]; ok && !preserve {
			if _, set := out["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
		}
		return out
	case []any:
		out := make([]any, len(value))
		for i, child := range value {
			out[i] = strictStructural(child)
		}
		return out
	default:
		return value
	}
}

// splitYAML splits a multi-document YAML stream into its non-empty documents.
func splitYAML(raw []byte) ([][]byte, error) {
	var documents [][]byte
	for _, part := range bytes.Split(append([]byte("\n"), raw...), []byte("\n---")) {
		if len(bytes.TrimSpace(part)) == 0 {
			continue
		}
		// A separator line may carry trailing text ("--- # comment"): drop the rest of that line.
		if newline := bytes.IndexByte(part, '\n'); newline >= 0 && !bytes.HasPrefix(part, []byte("\n")) {
			part = part[newline:]
		}
		documents = append(documents, part)
	}
	if len(documents) == 0 {
		return nil, io.ErrUnexpectedEOF
	}
	return documents, nil
}

func writeJSON(path string, value any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var buffer bytes.Buffer
	encoder := json.NewEncoder(&buffer)
	encoder.SetEscapeHTML(false)
	encoder.SetIndent("", " ")
	if err := encoder.Encode(value); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, buffer.Bytes(), 0o644)
}

// kstatus: prints the kstatus result (sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute, what Flux's
// health checks and `kubectl wait`-style tools use) of one Kubernetes object given as JSON on stdin or
// in the file named by the first argument. Output: one JSON line {"status": "...", "message": "..."}.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}

func run() error {
	in := io.Reader(os.Stdin)
	if len(os.Args) > 2 {
		return fmt.Errorf("usage: kstatus [object.json] (default: stdin)")
	}
	if len(os.Args) == 2 {
		f, err := os.Open(os.Args[1])
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	data, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	// UnmarshalJSON decodes integers as int64, as the API machinery does (kstatus reads
	// metadata.generation and status.observedGeneration as int64).
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		return fmt.Errorf("not a Kubernetes object: %w", err)
	}
	res, err := status.Compute(obj)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]string{
		"status":  res.Status.String(),
		"message": res.Message,
	})
}

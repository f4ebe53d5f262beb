//go:build tools

// Package tools pins kube-router's network policy controller (k3s-io's maintained fork, the copy k3s
// ships as its own NetworkPolicy enforcer) for the real node: see ../build.sh.
package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"

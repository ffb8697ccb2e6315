//go:build tools

// Package tools keeps the Kubernetes commands this module builds in go.mod and go.sum
// (go mod tidy drops modules nothing imports).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)

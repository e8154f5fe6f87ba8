//go:build tools

// Package tools only names the command build.sh builds, so `go mod tidy` keeps its dependencies.
package tools

import _ "helm.sh/helm/v3/cmd/helm"

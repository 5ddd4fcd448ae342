//go:build tools

// Package tools pins etcd's server for `go build go.etcd.io/etcd/server/v3`: its own go.mod replaces its
// sibling modules with directories, which only a wrapper module can build.
package tools

import _ "go.etcd.io/etcd/server/v3"

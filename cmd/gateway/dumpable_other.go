//go:build !linux

package main

// hideFromAgents does nothing off Linux: there is no /proc/<pid>/environ
// to hide (see dumpable_linux.go).
func hideFromAgents() error { return nil }

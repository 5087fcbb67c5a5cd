package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A cluster needs NATS credentials (or the explicit trusted-network
// switch) and a cluster secret; the secret and the password never show
// when the configuration is printed.
func TestClusterCredentials(t *testing.T) {
	const secret = "zzsecret-cluster-0123456789abcdef0123"
	base := []string{"GATEWAY_STORE__DRIVER=postgres", "GATEWAY_STORE__URL=postgres://h/db", "GATEWAY_CLUSTER__ENABLED=true"}
	url := "GATEWAY_CLUSTER__NATS__URLS=nats://127.0.0.1:4222"
	for _, c := range []struct {
		name string
		env  []string
		want string // "" = valid
	}{
		{"a URL's user", []string{"GATEWAY_CLUSTER__SECRET=" + secret, "GATEWAY_CLUSTER__NATS__URLS=nats://r1:zzsecret-pw@127.0.0.1:4222"}, ""},
		{"user and password", []string{url, "GATEWAY_CLUSTER__SECRET=" + secret, "GATEWAY_CLUSTER__NATS__USER=r1", "GATEWAY_CLUSTER__NATS__PASSWORD=zzsecret-pw"}, ""},
		{"creds file", []string{url, "GATEWAY_CLUSTER__SECRET=" + secret, "GATEWAY_CLUSTER__NATS__CREDSFILE=/etc/r1.creds"}, ""},
		{"nkey seed file", []string{url, "GATEWAY_CLUSTER__SECRET=" + secret, "GATEWAY_CLUSTER__NATS__NKEYSEEDFILE=/etc/r1.nk"}, ""},
		{"trusted network, said so", []string{url, "GATEWAY_CLUSTER__SECRET=" + secret, "GATEWAY_CLUSTER__NATS__INSECURETRUSTEDNETWORK=true"}, ""},
		{"secret file", []string{url, "GATEWAY_CLUSTER__SECRETFILE=/run/secret", "GATEWAY_CLUSTER__NATS__USER=r1", "GATEWAY_CLUSTER__NATS__PASSWORD=zzsecret-pw"}, ""},
		{"no credentials", []string{url, "GATEWAY_CLUSTER__SECRET=" + secret}, "cluster.nats: has no credentials"},
		{"no secret", []string{url, "GATEWAY_CLUSTER__NATS__USER=r1", "GATEWAY_CLUSTER__NATS__PASSWORD=zzsecret-pw"}, "cluster.secret: is required with cluster.enabled"},
		{"a short secret", []string{url, "GATEWAY_CLUSTER__SECRET=zzsecret-short", "GATEWAY_CLUSTER__NATS__INSECURETRUSTEDNETWORK=true"}, "cluster.secret: must be at least 32 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := loadFile(t, "", append(append([]string(nil), base...), c.env...)...)
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("err = %v, want %q", err, c.want)
				}
				if strings.Contains(err.Error(), "zzsecret") {
					t.Errorf("the error shows a secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := cfg.String(); strings.Contains(s, "zzsecret") {
				t.Errorf("the printed configuration shows a secret:\n%s", s)
			}
			for _, s := range []string{cfg.Cluster.Secret, cfg.Cluster.NATS.Password} {
				if s != "" && !contains(cfg.Secrets(), s) {
					t.Errorf("Secrets lacks a cluster secret")
				}
			}
		})
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// ClusterSecret reads cluster.secretFile without its white space, and
// refuses a short secret without showing it.
func TestClusterSecretFile(t *testing.T) {
	dir := t.TempDir()
	good, short := filepath.Join(dir, "good"), filepath.Join(dir, "short")
	os.WriteFile(good, []byte("  0123456789abcdef0123456789abcdef\n"), 0o600)
	os.WriteFile(short, []byte("zzsecret\n"), 0o600)
	if b, err := (Cluster{SecretFile: good}).ClusterSecret(); err != nil || string(b) != "0123456789abcdef0123456789abcdef" {
		t.Fatalf("ClusterSecret = %q, %v", b, err)
	}
	if _, err := (Cluster{SecretFile: short}).ClusterSecret(); err == nil || strings.Contains(err.Error(), "zzsecret") {
		t.Fatalf("a short secret file: %v", err)
	}
	if _, err := (Cluster{SecretFile: filepath.Join(dir, "none")}).ClusterSecret(); err == nil {
		t.Fatal("a missing secret file read")
	}
}

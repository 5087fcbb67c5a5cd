package ws

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
)

// A connection's identity. Who may abort a run is the identity that started
// it, and that identity must be one the client proved, not one it claimed:
// client.instanceId is self-declared (any client with the token could send
// another's), so it is not used. A client that signs the challenge with a
// device key (the TUI always does) is "device:<id>" — the same across its
// reconnects. A client without a device key (a browser page served over
// plain http off loopback has no WebCrypto) proved only its credential, and
// gets a new connection on every reload: all such clients holding the same
// credential are one identity — "shared:token" for the shared token (or,
// with no token, every loopback client: the only ones that may connect),
// "shared:operator" for the operator token. So a reloaded page may stop
// the turn it started; a device-signed client may not stop theirs, nor
// they its runs.

// ownerOf is the identity of a connection that proved device (its id, ""
// for none) with the operator token or not.
func ownerOf(device string, operator bool) string {
	switch {
	case device != "":
		return "device:" + device
	case operator:
		return "shared:operator"
	}
	return "shared:token"
}

// deviceProof is connect's device block: an Ed25519 signature over the
// challenge (docs/protocol.md §3, ../shared/openclaw-protocol.md §3).
type deviceProof struct {
	ID        string      `json:"id"`        // lowercase hex SHA-256 of the raw public key
	PublicKey string      `json:"publicKey"` // raw 32-byte key, base64url
	Signature string      `json:"signature"` // base64url
	SignedAt  json.Number `json:"signedAt"`
	Nonce     string      `json:"nonce"`
}

// verifiedDevice returns the device id that p's device block proves for
// the challenge nonce, or "" when there is no block or it proves nothing
// (wrong key, id, nonce or signature). The signed text is
// v3|id|client.id|client.mode|role|scopes,…|signedAt|token|nonce|platform|deviceFamily,
// token being one of signedTokens.
func verifiedDevice(p connectParams, nonce string) string {
	if len(p.Device) == 0 || nonce == "" {
		return ""
	}
	var d deviceProof
	if json.Unmarshal(p.Device, &d) != nil || d.Nonce != nonce {
		return ""
	}
	pub, err := decodeB64URL(d.PublicKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return ""
	}
	sum := sha256.Sum256(pub)
	if id := hex.EncodeToString(sum[:]); !strings.EqualFold(d.ID, id) {
		return ""
	}
	sig, err := decodeB64URL(d.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return ""
	}
	if _, err := strconv.ParseInt(string(d.SignedAt), 10, 64); err != nil {
		return ""
	}
	for _, token := range signedTokens(p) {
		msg := strings.Join([]string{"v3", d.ID, p.Client.ID, p.Client.Mode, p.Role, strings.Join(p.Scopes, ","),
			string(d.SignedAt), token, d.Nonce, asciiLower(p.Client.Platform), asciiLower(p.Client.DeviceFamily)}, "|")
		if ed25519.Verify(pub, []byte(msg), sig) {
			return strings.ToLower(d.ID)
		}
	}
	return ""
}

// signedTokens returns the texts the client may have put in the signature's
// token field: the real client signs auth.token ?? auth.deviceToken ??
// auth.bootstrapToken ("" when none), so a client holding a device token
// from another gateway and no shared token signs that device token. Any of
// them proves the key as well: the signature binds the key to this
// connection's nonce whatever the token text.
func signedTokens(p connectParams) []string {
	if p.Auth.Token != "" {
		return []string{p.Auth.Token}
	}
	out := []string{""}
	for _, t := range []string{p.Auth.DeviceToken, p.Auth.BootstrapToken} {
		if t != "" {
			out = append(out, t)
		}
	}
	return out
}

func decodeB64URL(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

// asciiLower trims s and lowercases its ASCII letters only, as the clients
// do for platform and deviceFamily.
func asciiLower(s string) string {
	b := []byte(strings.TrimSpace(s))
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

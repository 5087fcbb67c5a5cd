package telegram

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/config"
)

// SecretHeader is the header in which Telegram echoes the webhook's
// secret_token.
const SecretHeader = "X-Telegram-Bot-Api-Secret-Token"

// WebhookHandler returns the handler to mount on POST /telegram/webhook.
// It answers:
//
//   - 404 when the channel is in polling mode;
//   - 405 for a method other than POST;
//   - 401 when the secret header does not match
//     channels.telegram.webhookSecret (compared in constant time; the
//     attempt is logged at most once a minute, without the header);
//   - 503 (Retry-After: 5) before Run's start-up calls are done and after
//     it returned or Close was called — Telegram delivers the update again;
//   - 413 for a body over 1 MiB, 400 for a body that is not an update;
//   - 200 for an accepted update, which is then handled as a polled one
//     (including updates the bot deliberately ignores, so that Telegram
//     does not redeliver them). In a cluster (Options.Cluster) an update
//     is accepted once the update stream has stored it (any replica then
//     handles it); 500 when the stream did not confirm it, so Telegram
//     sends it again.
func (c *Channel) WebhookHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.mode != config.TelegramWebhook {
			http.Error(w, "telegram webhook is not enabled (channels.telegram.mode is polling)", http.StatusNotFound)
			return
		}
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		got := r.Header.Get(SecretHeader)
		if c.secret == "" || subtle.ConstantTimeCompare([]byte(got), []byte(c.secret)) != 1 {
			c.logBadSecret(r)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		c.mu.Lock()
		closing := c.closing
		c.mu.Unlock()
		if !c.ready.Load() || closing {
			w.Header().Set("Retry-After", "5")
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, webhookBodyLimit))
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "update too large", http.StatusRequestEntityTooLarge)
			return
		}
		var u models.Update
		if err != nil || json.Unmarshal(raw, &u) != nil {
			http.Error(w, "not a Telegram update", http.StatusBadRequest)
			return
		}
		if c.cl == nil {
			_ = c.dispatchDone(&u, stopOf(raw), nil)
			w.WriteHeader(http.StatusOK)
			return
		}
		ulog := c.updates.Load()
		if ulog == nil { // Run is stopping
			w.Header().Set("Retry-After", "5")
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if err := c.publishUpdate(r.Context(), ulog, raw); err != nil {
			c.log.Warn("telegram: webhook update not stored; Telegram will send it again", "update", u.ID, "err", c.red.err(err))
			http.Error(w, "update not stored", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}

func (c *Channel) logBadSecret(r *http.Request) {
	now := time.Now().Unix()
	last := c.secretLogged.Load()
	if now-last < 60 || !c.secretLogged.CompareAndSwap(last, now) {
		return
	}
	c.log.Warn("telegram: webhook request with a wrong or missing secret token refused", "remote", r.RemoteAddr)
}

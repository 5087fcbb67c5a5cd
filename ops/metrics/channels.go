package metrics

import (
	"context"
	"errors"
	"net/http"
	"path"

	"github.com/turnguard/turnguard/store"
)

// Results of a Telegram Bot API call, the "result" label of
// turnguard_telegram_api_calls_total.
const (
	ResultOK           = "ok"            // 2xx
	ResultRateLimited  = "rate_limited"  // 429
	ResultClientError  = "client_error"  // other 4xx: refused (bad request, blocked by the user, …)
	ResultServerError  = "server_error"  // 5xx
	ResultNetworkError = "network_error" // no HTTP answer
	ResultCanceled     = "canceled"      // the caller gave up (shutdown, a long poll cut short)
)

// TelegramCall counts one Bot API call of method (getUpdates, sendMessage,
// …) with result, one of the Result constants. Channels that do not use
// TelegramTransport call it themselves.
func (m *Metrics) TelegramCall(method, result string) {
	m.telegramCalls.WithLabelValues(label(method), label(result)).Inc()
}

// TelegramTransport wraps base (nil: http.DefaultTransport) so that every
// Bot API request through it is counted by TelegramCall: the method is the
// last segment of the request path (…/bot<token>/sendMessage → sendMessage;
// the token itself is never used as a label), the result comes from the
// HTTP status or the transport error. Give it to the Telegram channel as
// its HTTP client's transport.
func (m *Metrics) TelegramTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &telegramTransport{m: m, base: base}
}

type telegramTransport struct {
	m    *Metrics
	base http.RoundTripper
}

func (t *telegramTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	method := path.Base(req.URL.Path)
	res, err := t.base.RoundTrip(req)
	t.m.TelegramCall(method, callResult(req.Context(), res, err))
	return res, err
}

// callResult classifies a round trip.
func callResult(ctx context.Context, res *http.Response, err error) string {
	switch {
	case err != nil && (errors.Is(err, context.Canceled) || ctx.Err() != nil):
		return ResultCanceled
	case err != nil:
		return ResultNetworkError
	case res.StatusCode == http.StatusTooManyRequests:
		return ResultRateLimited
	case res.StatusCode >= 500:
		return ResultServerError
	case res.StatusCode >= 400:
		return ResultClientError
	}
	return ResultOK
}

// Outbox is what a channel asks of the durable outbox (the method set of
// store.Outbox without Counts; channels/telegram.Outbox is the same).
type Outbox interface {
	Enqueue(ctx context.Context, m store.OutboxMessage) (int64, error)
	MarkDelivered(ctx context.Context, id int64) error
	MarkAttempt(ctx context.Context, id int64, err error) error
	MarkFailed(ctx context.Context, id int64, reason string) error
	Pending(ctx context.Context, channel string, limit int) ([]store.OutboxMessage, error)
	MarkPartsSent(ctx context.Context, id int64, n int) error
	IsPending(ctx context.Context, id int64) (bool, error)
}

// Results of an outbox delivery, the "result" label of
// turnguard_deliveries_total.
const (
	DeliveryDelivered = "delivered" // MarkDelivered
	DeliveryRetry     = "retry"     // MarkAttempt: a failed attempt; the message stays pending
	DeliveryFailed    = "failed"    // MarkFailed: given up
)

// Outbox wraps the outbox a channel uses so that its deliveries, failed
// attempts (retries) and given-up messages are counted under channel. Each
// call is passed to inner unchanged; only calls inner accepts are counted.
func (m *Metrics) Outbox(channel string, inner Outbox) Outbox {
	return &countingOutbox{Outbox: inner, m: m, channel: label(channel)}
}

type countingOutbox struct {
	Outbox
	m       *Metrics
	channel string
}

func (o *countingOutbox) count(result string, err error) error {
	if err == nil {
		o.m.deliveries.WithLabelValues(o.channel, result).Inc()
	}
	return err
}

func (o *countingOutbox) MarkDelivered(ctx context.Context, id int64) error {
	return o.count(DeliveryDelivered, o.Outbox.MarkDelivered(ctx, id))
}

func (o *countingOutbox) MarkAttempt(ctx context.Context, id int64, err error) error {
	return o.count(DeliveryRetry, o.Outbox.MarkAttempt(ctx, id, err))
}

func (o *countingOutbox) MarkFailed(ctx context.Context, id int64, reason string) error {
	return o.count(DeliveryFailed, o.Outbox.MarkFailed(ctx, id, reason))
}

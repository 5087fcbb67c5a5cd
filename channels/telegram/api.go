package telegram

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/channels/delivery"
)

// ServerError is a Bot API answer with an HTTP 5xx status: Telegram (or a
// proxy in front of it) failed; the call may be retried.
type ServerError struct {
	Status int
}

func (e *ServerError) Error() string {
	return fmt.Sprintf("telegram server error: HTTP %d", e.Status)
}

// doer is the HTTP client handed to the bot library. It turns a 5xx
// response into a *ServerError (the library would otherwise try to decode
// an HTML error page and report an untyped error), so the retry logic can
// tell a server failure from a refused request.
//
// peek, if set, is shown the body of each getUpdates answer before the
// library reads it (peekUpdates: the updates the library cannot decode).
type doer struct {
	c    *http.Client
	peek func(body []byte)
}

// maxPeekBytes bounds the getUpdates answer doer reads for peek; a longer
// one goes to the library unpeeked.
const maxPeekBytes = 32 << 20

func (d doer) Do(req *http.Request) (*http.Response, error) {
	resp, err := d.c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 500 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		return nil, &ServerError{Status: resp.StatusCode}
	}
	if d.peek != nil && resp.StatusCode == http.StatusOK && strings.HasSuffix(req.URL.Path, "/getUpdates") {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxPeekBytes+1))
		if err == nil && len(body) <= maxPeekBytes {
			d.peek(body)
		}
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
	}
	return resp, nil
}

// readCloser reads r and closes c.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (r readCloser) Close() error { return r.c.Close() }

// redactor removes the bot token from text. The Bot API puts the token in
// every URL, so any error that quotes a URL would leak it.
type redactor struct{ secrets []string }

func newRedactor(token string) redactor {
	r := redactor{}
	if token != "" {
		r.secrets = append(r.secrets, token)
		// The part after the colon is the secret proper; catch it alone too
		// (an escaped or partly quoted URL).
		if _, s, ok := strings.Cut(token, ":"); ok && len(s) >= 8 {
			r.secrets = append(r.secrets, s)
		}
	}
	return r
}

const redacted = "[redacted]"

func (r redactor) text(s string) string {
	for _, sec := range r.secrets {
		s = strings.ReplaceAll(s, sec, redacted)
	}
	return s
}

// err returns err with the token removed from its text; errors.Is and
// errors.As still see the original chain. nil stays nil.
func (r redactor) err(err error) error {
	if err == nil {
		return nil
	}
	msg := r.text(err.Error())
	if msg == err.Error() {
		var re *redactedError
		if errors.As(err, &re) {
			return err
		}
	}
	return &redactedError{msg: msg, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// asDelivery turns an error of the bot library into the shared delivery
// code's terms: a 429 is a *delivery.RetryAfterError (at least one
// second), a refusal of the request (400, 401, 403, 404, 409, a chat
// migration) stays as it is (permanent), anything else — a 5xx, the
// network, an answer that could not be read — is temporary.
func asDelivery(err error) error {
	if err == nil {
		return nil
	}
	var tm *bot.TooManyRequestsError
	if errors.As(err, &tm) {
		return &delivery.RetryAfterError{After: time.Duration(max(tm.RetryAfter, 1)) * time.Second, Err: err}
	}
	var me *bot.MigrateError
	if errors.As(err, &me) || errors.Is(err, bot.ErrorBadRequest) || errors.Is(err, bot.ErrorForbidden) ||
		errors.Is(err, bot.ErrorUnauthorized) || errors.Is(err, bot.ErrorNotFound) || errors.Is(err, bot.ErrorConflict) {
		return err
	}
	return delivery.Temporary(err)
}

// classify sorts an error from the bot library (delivery.Classify of
// asDelivery). retryAfter is set for delivery.RateLimit.
func classify(ctx context.Context, err error) (c delivery.Class, retryAfter time.Duration) {
	return delivery.Classify(ctx, asDelivery(err))
}

// Bad-request descriptions the channel branches on.
func notModified(err error) bool {
	return errors.Is(err, bot.ErrorBadRequest) && strings.Contains(err.Error(), "message is not modified")
}

func editGone(err error) bool {
	if !errors.Is(err, bot.ErrorBadRequest) {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "message to edit not found") || strings.Contains(s, "message can't be edited")
}

// api is the handful of Bot API calls the channel makes.
type api struct {
	b   *bot.Bot
	url string // the Bot API's base URL, without a trailing slash (calls the library cannot make)
	hc  *http.Client
}

// send sends a message; markup (an inline keyboard) may be nil.
func (a api) send(ctx context.Context, chatID int64, text string, html bool, markup models.ReplyMarkup) (int, error) {
	p := &bot.SendMessageParams{ChatID: chatID, Text: text, ReplyMarkup: markup,
		LinkPreviewOptions: &models.LinkPreviewOptions{IsDisabled: bot.True()}}
	if html {
		p.ParseMode = models.ParseModeHTML
	}
	m, err := a.b.SendMessage(ctx, p)
	if err != nil {
		return 0, err
	}
	return m.ID, nil
}

// edit replaces a message's text; an inline keyboard under it is removed
// (editMessageText without reply_markup).
func (a api) edit(ctx context.Context, chatID int64, msgID int, text string) error {
	_, err := a.b.EditMessageText(ctx, &bot.EditMessageTextParams{ChatID: chatID, MessageID: msgID, Text: text,
		LinkPreviewOptions: &models.LinkPreviewOptions{IsDisabled: bot.True()}})
	return err
}

// dropButtons removes the inline keyboard under a message.
func (a api) dropButtons(ctx context.Context, chatID int64, msgID int) error {
	_, err := a.b.EditMessageReplyMarkup(ctx, &bot.EditMessageReplyMarkupParams{ChatID: chatID, MessageID: msgID})
	return err
}

func (a api) answerCallback(ctx context.Context, id, text string) error {
	_, err := a.b.AnswerCallbackQuery(ctx, &bot.AnswerCallbackQueryParams{CallbackQueryID: id, Text: text})
	return err
}

func (a api) typing(ctx context.Context, chatID int64) error {
	_, err := a.b.SendChatAction(ctx, &bot.SendChatActionParams{ChatID: chatID, Action: models.ChatActionTyping})
	return err
}

// draft shows text in a draft of a private chat (Bot API 10.3
// sendMessageDraft): text "" shows Telegram's "Thinking…" placeholder; a
// later call with the same draftID (non-zero) replaces the text, animated;
// canStop shows Telegram's Stop button, whose tap comes back as a
// stopped_message_generation update. A draft is a preview of about 30
// seconds: the message itself must follow with sendMessage.
//
// The library's SendMessageDraft cannot send can_stop, so the call is made
// here, on the same HTTP client (doer), with the library's errors
// (bot.ErrorBadRequest, *bot.TooManyRequestsError, …) so that asDelivery
// sorts them alike.
func (a api) draft(ctx context.Context, chatID int64, draftID int64, text string, html, canStop bool) error {
	fields := [][2]string{{"chat_id", strconv.FormatInt(chatID, 10)}, {"draft_id", strconv.FormatInt(draftID, 10)}, {"text", text}}
	if html {
		fields = append(fields, [2]string{"parse_mode", string(models.ParseModeHTML)})
	}
	if canStop {
		fields = append(fields, [2]string{"can_stop", "true"})
	}
	return a.call(ctx, "sendMessageDraft", fields)
}

// maxAnswerBytes bounds the answer read by call (a Bot API answer to a
// call the channel makes itself is a few hundred bytes).
const maxAnswerBytes = 64 << 10

// call makes a Bot API call the library has no parameters for: fields as
// multipart/form-data (as the library sends them), the answer's error as
// the library reports it.
func (a api) call(ctx context.Context, method string, fields [][2]string) error {
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	for _, f := range fields {
		if err := w.WriteField(f[0], f[1]); err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url+"/bot"+a.b.Token()+"/"+method, &body)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	req.Header.Set("Content-Type", w.FormDataContentType())
	resp, err := doer{c: a.hc}.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	defer resp.Body.Close()
	var ans struct {
		OK          bool   `json:"ok"`
		ErrorCode   int    `json:"error_code"`
		Description string `json:"description"`
		Parameters  struct {
			RetryAfter      int   `json:"retry_after"`
			MigrateToChatID int64 `json:"migrate_to_chat_id"`
		} `json:"parameters"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBytes)).Decode(&ans); err != nil {
		return fmt.Errorf("%s: HTTP %d, unreadable answer: %w", method, resp.StatusCode, err)
	}
	if ans.OK {
		return nil
	}
	switch ans.ErrorCode {
	case http.StatusTooManyRequests:
		return &bot.TooManyRequestsError{Message: fmt.Sprintf("%s, %s", bot.ErrorTooManyRequests, ans.Description), RetryAfter: ans.Parameters.RetryAfter}
	case http.StatusBadRequest:
		if ans.Parameters.MigrateToChatID != 0 {
			return &bot.MigrateError{Message: fmt.Sprintf("%s: %s", bot.ErrorBadRequest, ans.Description), MigrateToChatID: int(ans.Parameters.MigrateToChatID)}
		}
		return fmt.Errorf("%s: %w, %s", method, bot.ErrorBadRequest, ans.Description)
	case http.StatusUnauthorized:
		return fmt.Errorf("%s: %w, %s", method, bot.ErrorUnauthorized, ans.Description)
	case http.StatusForbidden:
		return fmt.Errorf("%s: %w, %s", method, bot.ErrorForbidden, ans.Description)
	case http.StatusNotFound:
		return fmt.Errorf("%s: %w, %s", method, bot.ErrorNotFound, ans.Description)
	case http.StatusConflict:
		return fmt.Errorf("%s: %w, %s", method, bot.ErrorConflict, ans.Description)
	}
	return fmt.Errorf("%s: error response from telegram: %d %s", method, ans.ErrorCode, ans.Description)
}

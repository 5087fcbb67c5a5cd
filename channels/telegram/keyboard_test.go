package telegram

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/event"
)

// TestKeyboardsSendNoEmptyCopyText: the client library's own button type
// encodes an empty copy_text, which the Bot API may refuse
// (BUTTON_COPY_TEXT_INVALID, as the fake Bot API does); the question's
// buttons and the Retry button are ours and send text and callback data
// only.
func TestKeyboardsSendNoEmptyCopyText(t *testing.T) {
	lib, _ := json.Marshal(&models.InlineKeyboardMarkup{InlineKeyboard: [][]models.InlineKeyboardButton{{{Text: "x", CallbackData: "y"}}}})
	if err := checkMarkup(string(lib)); err == nil {
		t.Fatalf("the fake accepts the library's button %s; it no longer checks what it should", lib)
	}
	a := &event.Approval{ID: "ap_0123456789abcdef01", Options: []event.ApprovalOption{
		{ID: "y", Label: "Allow once", Kind: "allow_once"}, {ID: "n", Label: "Deny", Kind: "reject_once"}}}
	ours, _ := json.Marshal(keyboard(a))
	want := `{"inline_keyboard":[[{"text":"Allow once","callback_data":"ap:ap_0123456789abcdef01:0"},` +
		`{"text":"Deny","callback_data":"ap:ap_0123456789abcdef01:1"}]]}`
	if string(ours) != want {
		t.Errorf("question keyboard %s\nwant %s", ours, want)
	}
	retry, _ := json.Marshal(&inlineKeyboard{InlineKeyboard: [][]inlineButton{{{Text: retryLabel, CallbackData: retryPrefix + "r1"}}}})
	for _, m := range []string{string(ours), string(retry)} {
		if strings.Contains(m, "copy_text") || checkMarkup(m) != nil {
			t.Errorf("keyboard %s", m)
		}
	}
}

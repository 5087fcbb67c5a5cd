package telegram

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-telegram/bot/models"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/gateway"
)

const (
	askScript    = "/steps ask:deploy say:Finished"
	questionText = "🔐 Approval needed: Run deploy\nAnswer within 5 min, or it will be denied."
	allowedText  = "✅ Allowed by @alice: Run deploy"
)

var aliceUser = models.User{ID: alice, FirstName: "Alice", Username: "alice"}

// press is user from tapping the inline button with data under message
// msgID of chat chatID (a private chat when chatID > 0, else a group).
func (f *fakeAPI) press(chatID int64, from models.User, msgID int, data string) string {
	f.mu.Lock()
	id := fmt.Sprintf("cbq-%d", f.nextUpdate+1)
	f.mu.Unlock()
	typ := models.ChatTypePrivate
	if chatID < 0 {
		typ = models.ChatTypeSupergroup
	}
	f.push(models.Update{CallbackQuery: &models.CallbackQuery{
		ID: id, From: from, Data: data, ChatInstance: "ci",
		Message: models.MaybeInaccessibleMessage{Type: models.MaybeInaccessibleMessageTypeMessage, Message: &models.Message{
			ID: msgID, Date: 1, Chat: models.Chat{ID: chatID, Type: typ},
			From: &models.User{ID: f.botID, IsBot: true, FirstName: "Turnguard Test"},
		}},
	}})
	return id
}

// keys is the inline keyboard under message msgID of chatID as
// "label=data" rows, nil without one.
func (f *fakeAPI) keys(chatID int64, msgID int) [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.msgs[chatID] {
		if m.id != msgID || m.markup == "" {
			continue
		}
		var mk models.InlineKeyboardMarkup
		if err := json.Unmarshal([]byte(m.markup), &mk); err != nil {
			return [][]string{{"bad markup: " + m.markup}}
		}
		var out [][]string
		for _, row := range mk.InlineKeyboard {
			var r []string
			for _, b := range row {
				r = append(r, b.Text+"="+b.CallbackData)
			}
			out = append(out, r)
		}
		return out
	}
	return nil
}

// questionMsg is the id of the question message in chatID, 0 if none.
func (f *fakeAPI) questionMsg(chatID int64) int {
	for _, c := range f.callsTo("sendMessage", chatID) {
		if c.Fault == "" && strings.HasPrefix(c.Text, "🔐") {
			return c.MsgID
		}
	}
	return 0
}

// toasts are the texts of the answerCallbackQuery calls, in order.
func (f *fakeAPI) toasts() []string {
	var out []string
	for _, c := range f.callsTo("answerCallbackQuery", 0) {
		out = append(out, c.Text)
	}
	return out
}

// askDeploy starts the demo's deploy question in alice's chat and returns
// the question message's id and the callback data of Allow and Deny.
func askDeploy(t *testing.T, h *harness) (msgID int, allow, deny string) {
	t.Helper()
	h.say(alice, askScript)
	h.advance(2 * time.Second)
	msgID = h.api.questionMsg(alice)
	if msgID == 0 {
		t.Fatalf("no question was sent; chat shows %q\nlogs:\n%s", h.screen(alice), h.logs.String())
	}
	pending := h.eng.PendingApprovals(SessionKey(alice))
	if len(pending) != 1 {
		t.Fatalf("pending approvals = %+v, want one", pending)
	}
	id := pending[0].ID
	allow, deny = "ap:"+id+":0", "ap:"+id+":1"
	want := [][]string{{"Allow=" + allow, "Deny=" + deny}}
	if got := h.api.keys(alice, msgID); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("question keyboard = %q, want %q", got, want)
	}
	if len(allow) > maxCallbackData {
		t.Fatalf("callback data %q is %d bytes, over Telegram's %d", allow, len(allow), maxCallbackData)
	}
	return msgID, allow, deny
}

// TestApprovalButtons: the runner's question appears with Allow and Deny
// buttons after what the turn showed before it; a press from another chat
// is refused; Allow is answered ("Allowed"), the question message is
// edited into who chose what (buttons gone), and the turn goes on and
// finishes; a second press changes nothing. In memory and with the store
// writing the endings (durable).
func TestApprovalButtons(t *testing.T) {
	for _, durable := range []bool{false, true} {
		name := "in memory"
		if durable {
			name = "durable"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := setup{adjust: func(c *config.Config) { c.Channels.Telegram.ShowSteps = true }}
				if durable {
					s.store = openStore(t, filepath.Join(t.TempDir(), "turnguard.db"))
				}
				h := newHarness(t, s)
				h.say(alice, "/steps fetch:1s ask:deploy say:Finished")
				h.advance(3 * time.Second)
				qID := h.api.questionMsg(alice)
				h.wantScreen(alice, "✅ fetch · 1 s", questionText)
				id := h.eng.PendingApprovals(SessionKey(alice))[0].ID
				allow := "ap:" + id + ":0"
				if got := h.api.keys(alice, qID); fmt.Sprint(got) != fmt.Sprint([][]string{{"Allow=" + allow, "Deny=ap:" + id + ":1"}}) {
					t.Fatalf("keyboard = %q", got)
				}

				// Another chat presses it (the same callback data): refused.
				h.api.press(bob, models.User{ID: bob, FirstName: "Bob"}, qID, allow)
				h.advance(time.Second)
				if n := len(h.eng.PendingApprovals("")); n != 1 {
					t.Fatalf("after bob's press %d questions are open, want 1", n)
				}

				h.api.press(alice, aliceUser, qID, allow)
				h.advance(5 * time.Second)
				h.wantScreen(alice, "✅ fetch · 1 s\n✅ deploy · 0 s", allowedText, "deploy ran (allowed). Finished")
				if k := h.api.keys(alice, qID); k != nil {
					t.Errorf("the answered question still has buttons %q", k)
				}
				edits := len(h.api.callsTo("editMessageText", alice))

				// A second press: answered, nothing edited again.
				h.api.press(alice, aliceUser, qID, allow)
				h.advance(5 * time.Second)
				if n := len(h.api.callsTo("editMessageText", alice)); n != edits {
					t.Errorf("a second press made %d more edits", n-edits)
				}
				want := []string{textApprovalNotYours, textApprovalAllowed, "Already answered: Allowed by @alice"}
				if got := h.api.toasts(); !slices.Equal(got, want) {
					t.Errorf("presses answered %q, want %q", got, want)
				}
			})
		})
	}
}

// TestApprovalDeny: Deny is answered "Denied"; the message shows it.
func TestApprovalDeny(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		qID, _, deny := askDeploy(t, h)
		h.api.press(alice, models.User{ID: alice, FirstName: "Alice"}, qID, deny)
		h.advance(5 * time.Second)
		h.wantScreen(alice, "🚫 Denied by Alice: Run deploy", "deploy was not run: denied. Finished")
		if got := h.api.toasts(); !slices.Equal(got, []string{textApprovalDenied}) {
			t.Errorf("toasts %q", got)
		}
	})
}

// TestApprovalTimeout: nobody answers within approvalTimeoutSeconds: the
// question is denied, its message says so without buttons, and no typing
// indicator was sent while it waited; a late press hears it was settled.
func TestApprovalTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{adjust: func(c *config.Config) {
			c.Channels.Telegram.Timeouts.ApprovalTimeoutSeconds = secs(60)
		}})
		h.say(alice, askScript)
		h.advance(2 * time.Second)
		qID := h.api.questionMsg(alice)
		asked := h.api.callsTo("sendMessage", alice)[0].At
		h.advance(time.Minute)
		h.wantScreen(alice, "⌛ No answer within 1 min, so it was denied: Run deploy", "deploy was not run: no answer in time. Finished")
		if k := h.api.keys(alice, qID); k != nil {
			t.Errorf("the timed-out question still has buttons %q", k)
		}
		for _, c := range h.api.callsTo("sendChatAction", alice) {
			if c.At > asked+time.Second && c.At < asked+59*time.Second {
				t.Errorf("typing sent at %v while the question waited (asked at %v)", c.At, asked)
			}
		}
		h.api.press(alice, aliceUser, qID, h.api.buttonData(qID))
		h.advance(2 * time.Second)
		if got := h.api.toasts(); !slices.Equal(got, []string{"Already answered: no answer in time, so it was denied"}) {
			t.Errorf("toasts %q", got)
		}
	})
}

// buttonData is the data of the Allow button the question message had when
// it was sent (it has none now).
func (f *fakeAPI) buttonData(msgID int) string {
	for _, c := range f.callsTo("sendMessage", 0) {
		if c.MsgID == msgID && c.Markup != "" {
			var mk models.InlineKeyboardMarkup
			if json.Unmarshal([]byte(c.Markup), &mk) == nil && len(mk.InlineKeyboard) > 0 {
				return mk.InlineKeyboard[0][0].CallbackData
			}
		}
	}
	return ""
}

// TestApprovalStop: /stop while the question is open stops the turn; the
// question message is edited to say it is no longer open, before the stop
// notice; a late press is told it is closed.
func TestApprovalStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		qID, allow, _ := askDeploy(t, h)
		h.say(alice, "/stop")
		h.advance(5 * time.Second)
		screen := h.screen(alice)
		if len(screen) != 2 || screen[0] != "⏹️ The request stopped before anyone answered: Run deploy" ||
			!strings.HasPrefix(screen[1], "⏹️ Stopped") {
			t.Fatalf("chat shows %q\nlogs:\n%s", screen, h.logs.String())
		}
		if k := h.api.keys(alice, qID); k != nil {
			t.Errorf("the stopped question still has buttons %q", k)
		}
		got := callLines(h.api.allCalls(), "sendMessage", "editMessageText")
		if len(got) != 3 || !strings.Contains(got[1], "editMessageText") || !strings.Contains(got[2], "⏹️ Stopped") {
			t.Errorf("calls:\n%s\nwant the edit before the stop notice", strings.Join(got, "\n"))
		}
		if n := len(h.eng.PendingApprovals("")); n != 0 {
			t.Errorf("%d questions still open", n)
		}
		h.api.press(alice, aliceUser, qID, allow)
		h.advance(2 * time.Second)
		if got := h.api.toasts(); !slices.Equal(got, []string{textApprovalClosed}) {
			t.Errorf("toasts %q", got)
		}
	})
}

// TestApprovalAnsweredElsewhere: an operator (or another channel) answers:
// the Telegram message is edited all the same.
func TestApprovalAnsweredElsewhere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		qID, _, _ := askDeploy(t, h)
		id := h.eng.PendingApprovals("")[0].ID
		if _, err := h.eng.Resolve(context.Background(), gateway.ResolveRequest{ApprovalID: id, OptionID: "allow", Operator: true}); err != nil {
			t.Fatal(err)
		}
		h.advance(5 * time.Second)
		h.wantScreen(alice, "✅ Allowed by an operator: Run deploy", "deploy ran (allowed). Finished")
		if k := h.api.keys(alice, qID); k != nil {
			t.Errorf("buttons left: %q", k)
		}
	})
}

// TestApprovalRateLimited: a 429 (and a 502) on the sendMessage with the
// keyboard is waited out / retried; the question then arrives with its
// buttons and works.
func TestApprovalRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{prepare: func(f *fakeAPI, _ *memTransport) {
			f.fail(fault{Method: "sendMessage", Chat: alice, Times: 1, Code: 429, Desc: "Too Many Requests: retry after 7", RetryAfter: 7})
			f.fail(fault{Method: "sendMessage", Chat: alice, Times: 1, Status: 502, Desc: "bad gateway"})
		}})
		h.say(alice, askScript)
		h.advance(10 * time.Second)
		sends := h.api.callsTo("sendMessage", alice)
		if len(sends) != 3 || sends[0].Fault == "" || sends[1].Fault == "" || sends[2].Fault != "" {
			t.Fatalf("sends:\n%s", strings.Join(callLines(sends), "\n"))
		}
		if wait := sends[1].At - sends[0].At; wait < 7*time.Second {
			t.Errorf("retried %v after the 429, want at least its retry_after of 7s", wait)
		}
		if !strings.Contains(sends[2].Markup, "ap:ap_") {
			t.Errorf("the question went without its buttons: %q", sends[2].Markup)
		}
		qID := sends[2].MsgID
		h.api.press(alice, aliceUser, qID, h.api.buttonData(qID))
		h.advance(5 * time.Second)
		h.wantScreen(alice, allowedText, "deploy ran (allowed). Finished")
	})
}

// TestApprovalUnknown: a press on a question the gateway does not know (it
// restarted: the store has it as expired) is told it is no longer open,
// and the message loses its buttons. (In a cluster the engine first passes
// the answer to the replica that runs the chat's turn:
// gateway.TestClusterAnswerIsForwardedToTheQuestionsReplica.)
func TestApprovalUnknown(t *testing.T) {
	const data = "ap:ap_0123456789abcdef0123:0"
	seed := func(f *fakeAPI, _ *memTransport) {
		f.nextMsg[alice] = 1
		f.msgs[alice] = []*fakeMsg{{id: 1, text: questionText, markup: `{"inline_keyboard":[[{"text":"Allow","callback_data":"` + data + `"}]]}`}}
	}
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{prepare: seed})
		h.api.press(alice, aliceUser, 1, data)
		h.advance(3 * time.Second)
		if got := h.api.toasts(); !slices.Equal(got, []string{textApprovalClosed}) {
			t.Errorf("toasts %q", got)
		}
		if k := h.api.keys(alice, 1); k != nil {
			t.Errorf("buttons left: %q", k)
		}
		h.wantScreen(alice, questionText)
	})
}

// TestApprovalCallbackUpdates: polling asks Telegram for callback_query
// updates.
func TestApprovalCallbackUpdates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		h.api.mu.Lock()
		allowed := h.api.allowed
		h.api.mu.Unlock()
		if !strings.Contains(allowed, `"callback_query"`) {
			t.Errorf("getUpdates allowed_updates = %q, want callback_query in it", allowed)
		}
	})
}

// TestApprovalData: callback data round trips and stays under 64 bytes;
// junk is refused.
func TestApprovalData(t *testing.T) {
	id := "ap_0123456789abcdef01"
	for i := range 8 {
		d := approvalData(id, i)
		if len(d) > maxCallbackData {
			t.Errorf("%q is over %d bytes", d, maxCallbackData)
		}
		if gid, gi, ok := parseApprovalData(d); !ok || gid != id || gi != i {
			t.Errorf("parse(%q) = %q %d %v", d, gid, gi, ok)
		}
	}
	for _, bad := range []string{"ap:", "ap:x:1", "ap:ap_1", "ap:ap_1:-1", "ap:ap_1:z", "retry:ap_1:0"} {
		if _, _, ok := parseApprovalData(bad); ok {
			t.Errorf("parse(%q) ok", bad)
		}
	}
}

// TestApprovalGroupOnlySender: in a group, only the member who sent the
// request may answer its question (as with /stop and Retry); the sender's
// answer works.
func TestApprovalGroupOnlySender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, setup{})
		h.api.push(groupMsg(alice, "/steps@"+botName+" ask:deploy say:Finished"))
		synctest.Wait()
		h.advance(4 * time.Second)
		qID := h.api.questionMsg(groupChatID)
		if qID == 0 {
			t.Fatalf("no question; group shows %q", h.screen(groupChatID))
		}
		allow := h.api.buttonData(qID)
		h.api.press(groupChatID, models.User{ID: bob, FirstName: "Bob"}, qID, allow)
		h.advance(4 * time.Second)
		h.api.press(groupChatID, aliceUser, qID, allow)
		h.advance(8 * time.Second)
		if got := h.api.toasts(); !slices.Equal(got, []string{textApprovalNotOwner, textApprovalAllowed}) {
			t.Errorf("toasts %q", got)
		}
		h.wantScreen(groupChatID, allowedText, "deploy ran (allowed). Finished")
	})
}

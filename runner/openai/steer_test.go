package openai

import (
	"net/http"
	"slices"
	"testing"
	"testing/synctest"

	"github.com/turnguard/turnguard/config"
	"github.com/turnguard/turnguard/runner"
)

// TestSteeredMessagesReachTheModel: a message steered in during a model
// call reaches the next call as a user message (after the tool results);
// one steered in during the final answer gets one more call.
func TestSteeredMessagesReachTheModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inbox := &runner.Inbox{}
		putThen := func(text string, h http.HandlerFunc) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) { inbox.Put(text); h(w, r) }
		}
		fake := newFake(t,
			putThen("and in Berlin?", callTool("call_a", "current_time", `{}`)),
			putThen("thanks, and Tokyo?", answer("Noon in both.")),
			answer("Tokyo: 8 pm."),
		)
		r, _ := newTestRunner(t, config.OpenAI{Tools: config.OpenAITools{CurrentTime: true}}, fake)
		if !r.Steers() {
			t.Fatal("the openai runner does not steer")
		}
		tr := turn
		tr.Inbox = inbox
		res, err := r.Run(t.Context(), tr, newRecorder())
		if err != nil {
			t.Fatal(err)
		}
		if want := "Noon in both.\n\nTokyo: 8 pm."; res.Text != want {
			t.Errorf("text %q, want %q", res.Text, want)
		}
		reqs := fake.requests()
		if len(reqs) != 3 {
			t.Fatalf("%d requests, want 3", len(reqs))
		}
		roles := func(i int) (out []string) {
			for _, m := range reqs[i].body.Messages {
				c := ""
				if m.Content != nil && m.Role != "tool" {
					c = " " + *m.Content
				}
				out = append(out, m.Role+c)
			}
			return out
		}
		if got, want := roles(1), []string{"user What time is it in Paris?", "assistant", "tool", "user and in Berlin?"}; !slices.Equal(got, want) {
			t.Errorf("second call's messages %q, want %q", got, want)
		}
		if got := roles(2); !slices.Equal(got[len(got)-2:], []string{"assistant Noon in both.", "user thanks, and Tokyo?"}) {
			t.Errorf("third call's messages %q", got)
		}
	})
}

// TestGatewayNoteReachesTheModel: a note of the gateway (a budget warning)
// put in during a model call reaches the next call as a system message; one
// put in during the final answer asks for no further call.
func TestGatewayNoteReachesTheModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inbox := &runner.Inbox{}
		noteThen := func(text string, h http.HandlerFunc) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) { inbox.Note(text); h(w, r) }
		}
		fake := newFake(t,
			noteThen("1 min left, wrap up", callTool("call_a", "current_time", `{}`)),
			noteThen("late note", answer("Noon.")),
		)
		r, _ := newTestRunner(t, config.OpenAI{Tools: config.OpenAITools{CurrentTime: true}}, fake)
		tr := turn
		tr.Inbox = inbox
		res, err := r.Run(t.Context(), tr, newRecorder())
		if err != nil {
			t.Fatal(err)
		}
		if res.Text != "Noon." {
			t.Errorf("text %q, want %q", res.Text, "Noon.")
		}
		reqs := fake.requests()
		if len(reqs) != 2 {
			t.Fatalf("%d requests, want 2 (a note after the final answer asks for no more)", len(reqs))
		}
		msgs := reqs[1].body.Messages
		if last := msgs[len(msgs)-1]; last.Role != "system" || last.Content == nil || *last.Content != "1 min left, wrap up" {
			t.Errorf("the second call ends with %+v, want the gateway's note as a system message", last)
		}
	})
}

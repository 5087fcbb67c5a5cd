package acp

// Questions other than permissions: the agent's elicitation/create (ACP
// v1.7 stable) reaches the person through the same approvals machinery as
// session/request_permission — buttons on Telegram and in the web chat —
// so an elicitation is asked only when its answer is a choice:
//
//   - form mode with no field: "Accept" / "Decline";
//   - form mode with one boolean field: "Yes" / "No" (accept with
//     true / false);
//   - form mode with one string field of at most maxOptions-1 choices
//     (enum, or oneOf with titles): a button per choice, and "Decline";
//   - url mode with an http(s) URL: the URL as the question's detail,
//     "Done" (accept) / "Decline".
//
// Anything else (free text, numbers, several fields, a request-scoped
// elicitation outside a turn) cannot be answered with a button: the agent
// gets "decline" at once and the log says why. While the question is open
// the turn's liveness clock is paused, and nobody answering within
// approvalTimeoutSeconds is "cancel"; so is a turn stopped meanwhile.

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"

	"github.com/turnguard/turnguard/runner"
)

// elicitRequest is elicitation/create's params (the session-scoped form
// and url modes; a request-scoped one has no sessionId).
type elicitRequest struct {
	SessionID       string        `json:"sessionId"`
	Mode            string        `json:"mode"`
	Message         string        `json:"message"`
	RequestedSchema *elicitSchema `json:"requestedSchema"`
	URL             string        `json:"url"`
	ElicitationID   string        `json:"elicitationId"`
}

type elicitSchema struct {
	Properties map[string]elicitProperty `json:"properties"`
}

type elicitProperty struct {
	Type  string   `json:"type"`
	Title *string  `json:"title"`
	Enum  []string `json:"enum"`
	OneOf []struct {
		Const string `json:"const"`
		Title string `json:"title"`
	} `json:"oneOf"`
}

// elicitResponse is elicitation/create's result: action accept (with the
// content, for a form), decline or cancel.
type elicitResponse struct {
	Action  string         `json:"action"`
	Content map[string]any `json:"content,omitempty"`
}

func elicitCancelled() elicitResponse { return elicitResponse{Action: "cancel"} }

// elicitAsk is an elicitation turned into the person's question, with the
// content each accepting option sends back (nil: accept without content).
type elicitAsk struct {
	q       runner.Question
	content map[string]map[string]any // option id → content
}

// The ids of the options of an elicitation's question.
const (
	elicitAccept  = "accept"
	elicitDecline = "decline"
)

// elicitQuestion turns req into a question, or says why it cannot be
// asked with buttons.
func elicitQuestion(req elicitRequest) (elicitAsk, error) {
	title := cut(oneLine(req.Message), 300)
	if title == "" {
		title = "The agent asks a question"
	}
	a := elicitAsk{q: runner.Question{Title: title, Tool: "question"}, content: map[string]map[string]any{}}
	decline := runner.Option{ID: elicitDecline, Label: "Decline", Kind: runner.RejectOnce}
	switch req.Mode {
	case "url":
		u, err := url.Parse(req.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(req.URL) > 2000 {
			return a, fmt.Errorf("url mode needs an http(s) URL of at most 2000 bytes")
		}
		a.q.Detail = req.URL
		a.q.Options = []runner.Option{{ID: elicitAccept, Label: "Done", Kind: runner.AllowOnce}, decline}
		return a, nil
	case "form":
	default:
		return a, fmt.Errorf("mode %q is not form or url", cut(req.Mode, 50))
	}
	var props map[string]elicitProperty
	if req.RequestedSchema != nil {
		props = req.RequestedSchema.Properties
	}
	switch len(props) {
	case 0:
		a.q.Options = []runner.Option{{ID: elicitAccept, Label: "Accept", Kind: runner.AllowOnce}, decline}
		a.content[elicitAccept] = map[string]any{}
		return a, nil
	case 1:
	default:
		return a, fmt.Errorf("a form of %d fields cannot be answered with buttons", len(props))
	}
	for name, p := range props {
		if p.Title != nil && *p.Title != "" {
			a.q.Detail = cut(oneLine(*p.Title), 200)
		}
		switch {
		case p.Type == "boolean":
			a.q.Options = []runner.Option{{ID: "yes", Label: "Yes", Kind: runner.AllowOnce}, {ID: "no", Label: "No", Kind: runner.RejectOnce}}
			a.content["yes"] = map[string]any{name: true}
			a.content["no"] = map[string]any{name: false}
		case p.Type == "string" && (len(p.Enum) > 0 || len(p.OneOf) > 0):
			type choice struct{ value, label string }
			var choices []choice
			for _, v := range p.Enum {
				choices = append(choices, choice{v, v})
			}
			for _, o := range p.OneOf {
				label := o.Title
				if label == "" {
					label = o.Const
				}
				choices = append(choices, choice{o.Const, label})
			}
			if len(choices) > maxOptions-1 {
				return a, fmt.Errorf("%d choices, at most %d", len(choices), maxOptions-1)
			}
			for i, c := range choices {
				id := "v" + strconv.Itoa(i)
				a.q.Options = append(a.q.Options, runner.Option{ID: id, Label: cut(c.label, maxLabel), Kind: runner.AllowOnce})
				a.content[id] = map[string]any{name: c.value}
			}
			a.q.Options = append(a.q.Options, decline)
		default:
			return a, fmt.Errorf("a %s field without choices cannot be answered with buttons", cut(p.Type, 50))
		}
	}
	return a, nil
}

// answer is the agent's result for the person's answer: accept with the
// chosen option's content, decline for the decline option, cancel when
// nobody answered in time or the turn was stopped (err).
func (a elicitAsk) answer(ans runner.Answer, err error) elicitResponse {
	switch {
	case err != nil, ans.Outcome != runner.Selected:
		return elicitCancelled()
	case ans.OptionID == elicitDecline:
		return elicitResponse{Action: "decline"}
	}
	c, ok := a.content[ans.OptionID]
	if !ok && ans.OptionID != elicitAccept {
		return elicitResponse{Action: "decline"}
	}
	return elicitResponse{Action: "accept", Content: c}
}

// parseElicit reads elicitation/create's params.
func parseElicit(params json.RawMessage) (elicitRequest, error) {
	var req elicitRequest
	err := json.Unmarshal(params, &req)
	return req, err
}

package messages

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"text/template"
	"text/template/parse"
	"time"
)

// Bounds of a template: a message is a sentence or two, so a template may
// neither loop, nor recurse, nor produce or allocate much. Parse refuses what
// could (a range, a template call, a printf width); execution stops at
// MaxOutputBytes or after MaxExecTime, whichever comes first.
const (
	MaxTemplateBytes = 4096        // longest template text (messages.<name>)
	MaxOutputBytes   = 4096        // longest rendered message
	MaxExecTime      = time.Second // longest execution of one template (a last resort: loops are refused and every growing builtin is bounded, so a real template takes microseconds; generous so a loaded machine never trips it)
	maxFormatWidth   = 64          // largest printf width or precision
)

// ErrOutputTooLong is the execution error of a template whose output passed
// MaxOutputBytes.
var ErrOutputTooLong = fmt.Errorf("the message is longer than %d bytes", MaxOutputBytes)

// errTooSlow is the execution error of a template that ran past MaxExecTime.
var errTooSlow = fmt.Errorf("the message took longer than %s to render", MaxExecTime)

// boundedWriter accepts at most MaxOutputBytes and fails every write after
// its deadline; text/template stops executing at the first failed write.
type boundedWriter struct {
	buf      []byte
	deadline time.Time
}

func newBoundedWriter() *boundedWriter {
	return &boundedWriter{deadline: time.Now().Add(MaxExecTime)}
}

func (w *boundedWriter) Write(p []byte) (int, error) {
	if len(w.buf)+len(p) > MaxOutputBytes {
		return 0, ErrOutputTooLong
	}
	if time.Now().After(w.deadline) {
		return 0, errTooSlow
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// boundedFuncs replace text/template's builtins whose result can be longer
// than their arguments (print, printf, println, html, js, urlquery): each
// fails once its result would pass MaxOutputBytes. A template's functions
// take precedence over the builtins. Without them a template that writes
// nothing could double a string per action ({{$a := print $a $a}}, or
// {{… | js | js …}} on a backslash) to gigabytes, since the output cap is
// only checked when the template writes. The other builtins (and, or, not,
// len, index, slice, the comparisons, call) return at most what they are
// given, and no field is a function.
var boundedFuncs = template.FuncMap{
	"print":    func(a ...any) (string, error) { return capped("print", fmt.Sprint(a...)) },
	"printf":   func(f string, a ...any) (string, error) { return capped("printf", fmt.Sprintf(f, a...)) },
	"println":  func(a ...any) (string, error) { return capped("println", fmt.Sprintln(a...)) },
	"html":     func(a ...any) (string, error) { return capped("html", template.HTMLEscaper(a...)) },
	"js":       func(a ...any) (string, error) { return capped("js", template.JSEscaper(a...)) },
	"urlquery": func(a ...any) (string, error) { return capped("urlquery", template.URLQueryEscaper(a...)) },
}

// capped returns s, or an error if it is longer than MaxOutputBytes. Its
// arguments are bounded in turn (fields, literals of a template of at most
// MaxTemplateBytes, earlier results), so computing s before the check costs
// at most a few times MaxOutputBytes.
func capped(fn, s string) (string, error) {
	if len(s) > MaxOutputBytes {
		return "", fmt.Errorf("%s would give more than %d bytes (a message is at most %d)", fn, MaxOutputBytes, MaxOutputBytes)
	}
	return s, nil
}

// newTemplate is an empty template named name with the bounded functions.
func newTemplate(name string) *template.Template {
	return template.New(name).Funcs(boundedFuncs)
}

// execute runs t on f within the bounds and returns the text.
func execute(t *template.Template, f Fields) (string, error) {
	w := newBoundedWriter()
	if err := t.Execute(w, f); err != nil {
		return "", err
	}
	return string(w.buf), nil
}

// printfVerb matches one printf directive's flags, width and precision.
var printfVerb = regexp.MustCompile(`%[-+# 0]*(?:\[\d+\])?(\*|\d*)(?:\.(?:\[\d+\])?(\*|\d*))?`)

// checkTree refuses the constructs that let a message template run long or
// allocate much, naming the line: range (no field is a list, and ranging over
// a number such as .Elapsed — nanoseconds — loops billions of times),
// template calls and blocks (they can recurse), break/continue (only
// meaningful in a range), assigning to a variable again ({{$x = …}}: with
// the bounded functions each action's result is bounded, and without
// reassignment or loops the number of actions — hence the work — is bounded
// by the template's length), and printf with a non-constant format or a width or
// precision above maxFormatWidth.
func checkTree(t *template.Template) error {
	for _, tt := range t.Templates() {
		if tt.Tree == nil || tt.Root == nil {
			continue
		}
		if err := checkNode(tt.Tree, tt.Root); err != nil {
			return err
		}
	}
	return nil
}

func checkNode(tree *parse.Tree, n parse.Node) error {
	if n == nil {
		return nil
	}
	at := func(what string) error {
		loc, _ := tree.ErrorContext(n)
		return fmt.Errorf("%s: %s", loc, what)
	}
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return nil
		}
		for _, c := range n.Nodes {
			if err := checkNode(tree, c); err != nil {
				return err
			}
		}
	case *parse.RangeNode:
		return at("{{range}} is not allowed in a message: no field is a list, and ranging over a number (such as .Elapsed, in nanoseconds) would loop billions of times")
	case *parse.TemplateNode:
		return at("{{template}} and {{block}} are not allowed in a message (they can recurse)")
	case *parse.BreakNode, *parse.ContinueNode:
		return at("{{break}} and {{continue}} are not allowed in a message")
	case *parse.IfNode:
		return checkBranch(tree, &n.BranchNode)
	case *parse.WithNode:
		return checkBranch(tree, &n.BranchNode)
	case *parse.ActionNode:
		return checkNode(tree, n.Pipe)
	case *parse.PipeNode:
		if n == nil {
			return nil
		}
		if n.IsAssign {
			return at("assigning to a variable again ({{$a = …}}) is not allowed in a message; declare a new one with {{$b := …}}")
		}
		for _, c := range n.Cmds {
			if err := checkNode(tree, c); err != nil {
				return err
			}
		}
	case *parse.CommandNode:
		if len(n.Args) > 0 {
			if id, ok := n.Args[0].(*parse.IdentifierNode); ok && id.Ident == "printf" {
				if err := checkPrintf(n); err != nil {
					return at(err.Error())
				}
			}
		}
		for _, a := range n.Args {
			if err := checkNode(tree, a); err != nil {
				return err
			}
		}
	case *parse.ChainNode:
		return checkNode(tree, n.Node)
	}
	return nil
}

func checkBranch(tree *parse.Tree, b *parse.BranchNode) error {
	for _, c := range []parse.Node{b.Pipe, b.List, b.ElseList} {
		if err := checkNode(tree, c); err != nil {
			return err
		}
	}
	return nil
}

// checkPrintf accepts printf with a constant format whose widths and
// precisions are at most maxFormatWidth.
func checkPrintf(n *parse.CommandNode) error {
	var s *parse.StringNode
	ok := false
	if len(n.Args) >= 2 { // else the format is piped in: not a constant
		s, ok = n.Args[1].(*parse.StringNode)
	}
	if !ok {
		return errors.New("printf needs a constant format string in a message")
	}
	for _, m := range printfVerb.FindAllStringSubmatch(s.Text, -1) {
		for _, num := range m[1:] {
			if num == "*" {
				return errors.New("printf widths and precisions from arguments (*) are not allowed in a message")
			}
			if v, err := strconv.Atoi(num); num != "" && (err != nil || v > maxFormatWidth) {
				return fmt.Errorf("printf width or precision %s is above %d", num, maxFormatWidth)
			}
		}
	}
	return nil
}

package gateway

import "github.com/turnguard/turnguard/runner"

// RunnerOf returns the runner that channel's turns run on under the
// current configuration (nil when it names none). The conversation core
// asks it for what the runner knows beyond turns (an ACP agent's commands
// and modes). A runner.Wrapper is unwrapped: the runner it stands for is
// returned (itself while it stands for none).
func (e *Engine) RunnerOf(channel string) runner.Runner {
	r := e.runners[e.cfg.Current().RunnerFor(channel)]
	if w, ok := r.(runner.Wrapper); ok {
		if u := w.Unwrap(); u != nil {
			return u
		}
	}
	return r
}

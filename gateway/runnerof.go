package gateway

import "github.com/turnguard/turnguard/runner"

// RunnerOf returns the runner that channel's turns run on under the
// current configuration (nil when it names none). The conversation core
// asks it for what the runner knows beyond turns (an ACP agent's commands
// and modes).
func (e *Engine) RunnerOf(channel string) runner.Runner {
	return e.runners[e.cfg.Current().RunnerFor(channel)]
}

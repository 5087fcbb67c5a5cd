//go:build !linux

package exec

import "errors"

// waitExited is not available here: the group's leftovers are not killed
// after a normal exit.
func waitExited(pid int) error { return errors.ErrUnsupported }

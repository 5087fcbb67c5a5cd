module turnguard.test/goagent

go 1.26.0

require github.com/coder/acp-go-sdk v0.13.0

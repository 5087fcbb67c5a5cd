package messages

// The words a person reads on the operator page (/admin) when the operator
// API turns them away. The API's JSON keeps its precise `error` for API
// clients ("unauthorized: send Authorization: Bearer …"); these go in its
// `message`, which the page shows.
const (
	// AdminTokenNeeded: no token, or a wrong one.
	AdminTokenNeeded = "This page is for the gateway's operators. Enter the operator token " +
		"(ask whoever runs this gateway), or open the link with #token=… they gave you."
	// AdminLoopbackOnly: no operator token is configured and the request
	// came from another machine.
	AdminLoopbackOnly = "This page opens only on the gateway's own machine, because no operator token " +
		"is set. Open it there (http://127.0.0.1:…/admin), or ask whoever runs this gateway to set one."
)

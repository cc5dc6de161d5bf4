public enum HeraldClientError: Error, Sendable, Equatable {
    /// The gateway refused a request: `code` is its error code
    /// (`not_found`, `precondition_failed`, `forbidden`, ... PROTOCOL.md 11).
    case server(code: String, message: String)
    /// No live connection to send the request on.
    case notConnected
    /// The connection closed before the gateway answered.
    case disconnected
    /// The gateway closed the connection in a way retrying cannot fix
    /// (4003: the token names another device or the device was deleted;
    /// 1008: the hello was refused). The client stops.
    case refused(closeCode: Int, reason: String)
    /// A connection failed or closed (`closeCode` 1006: no close frame, e.g.
    /// refused, dropped, or a certificate that did not verify); the client
    /// retries.
    case connectionLost(closeCode: Int, reason: String)
    /// A frame this client cannot read; it was skipped and changed nothing.
    case badFrame(String)
    /// A frame type this client does not know; skipped (newer gateway).
    case unknownFrame(type: String)
    /// An HTTP request got no answer: refused, dropped, timed out, or a
    /// certificate that did not verify.
    case unreachable(String)
    /// The task waiting for the answer was cancelled.
    case cancelled
    /// The token provider threw; the client retries with backoff.
    case tokenUnavailable(String)
    /// The state file could not be opened, read or written.
    case stateFile(String)
    case badURL(String)
}

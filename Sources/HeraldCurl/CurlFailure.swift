import CCurl

/// Why a request got no answer.
public enum CurlFailure: Error, Sendable, Equatable, CustomStringConvertible {
    case timedOut
    /// Waited in the client past its `startWithin` for room on the wire: never sent.
    case notStarted
    case connect(String)
    case tls(String)
    /// Never sent: not `https`, a malformed URL, method or header.
    case refused(String)
    /// The answer's headers or body were longer than the client takes.
    case tooLarge
    /// The client stopped before the answer came.
    case stopped
    case other(String)

    public var description: String {
        switch self {
        case .timedOut: "timed out"
        case .notStarted: "not sent: no room on the wire in time"
        case .connect(let m): "could not connect: \(m)"
        case .tls(let m): "TLS: \(m)"
        case .refused(let m): "refused: \(m)"
        case .tooLarge: "answer too large"
        case .stopped: "client stopped"
        case .other(let m): m
        }
    }

    /// The failure a transfer's result code stands for; `detail` is curl's message.
    init(_ code: CURLcode, detail: String) {
        switch code {
        case CURLE_OPERATION_TIMEDOUT: self = .timedOut
        case CURLE_UNSUPPORTED_PROTOCOL, CURLE_URL_MALFORMAT: self = .refused(detail)
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_CONNECT: self = .connect(detail)
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER,
             CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS:
            self = .tls(detail)
        case CURLE_FILESIZE_EXCEEDED: self = .tooLarge
        default: self = .other(detail)
        }
    }
}

/// The error codes of SPEC section 6, shared by HTTP and WebSocket.
public enum ErrorCode: String, Sendable {
    case badRequest = "bad_request"
    case unauthorized
    case forbidden
    case notFound = "not_found"
    case methodNotAllowed = "method_not_allowed"
    case preconditionFailed = "precondition_failed"
    case tooLarge = "too_large"
    case rateLimited = "rate_limited"
    case unavailable

    public var httpStatus: Int {
        switch self {
        case .badRequest: 400
        case .unauthorized: 401
        case .forbidden: 403
        case .notFound: 404
        case .methodNotAllowed: 405
        case .preconditionFailed: 412
        case .tooLarge: 413
        case .rateLimited: 429
        case .unavailable: 503
        }
    }
}

public struct HeraldError: Error, Sendable, Equatable, CustomStringConvertible {
    public let code: ErrorCode
    public let message: String
    /// For `rate_limited`: when to try again.
    public var retryAfterSeconds: Int?
    /// For `method_not_allowed`: the methods the resource takes (the `Allow` header).
    public var allowedMethods: [String]?
    public init(_ code: ErrorCode, _ message: String, retryAfterSeconds: Int? = nil, allowedMethods: [String]? = nil) {
        self.code = code; self.message = message; self.retryAfterSeconds = retryAfterSeconds
        self.allowedMethods = allowedMethods
    }
    public var description: String { "\(code.rawValue): \(message)" }

    public static func badRequest(_ m: String) -> HeraldError { HeraldError(.badRequest, m) }
    public static let notFound = HeraldError(.notFound, "no such notification")

    /// `{"error": {"code", "message"}}`
    public var json: JSON { ["error": ["code": .string(code.rawValue), "message": .string(message)]] }
}

/// A failure of the storage layer (I/O, locking, corruption): answered 503.
public struct StoreError: Error, Sendable, CustomStringConvertible {
    public let description: String
    /// The transaction lost a conflict with another one (a deadlock, a
    /// serialization failure) and was rolled back: running it again from
    /// its start may well succeed.
    public let conflict: Bool
    /// The connection was lost after COMMIT was sent and before its answer
    /// came: the transaction may have committed, or not.
    public let outcomeUnknown: Bool
    public init(_ d: String, conflict: Bool = false, outcomeUnknown: Bool = false) {
        description = d; self.conflict = conflict; self.outcomeUnknown = outcomeUnknown
    }
}

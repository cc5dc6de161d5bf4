/// The claims of a device token (SPEC section 2).
public struct DeviceClaims: Sendable, Equatable {
    public let app: String
    public let user: String
    public let device: String?
    public let issuedAt: Int64
    public let expiresAt: Int64
    public let notBefore: Int64?

    public init(app: String, user: String, device: String?, issuedAt: Int64, expiresAt: Int64, notBefore: Int64? = nil) {
        self.app = app; self.user = user; self.device = device
        self.issuedAt = issuedAt; self.expiresAt = expiresAt; self.notBefore = notBefore
    }
    public var userKey: UserKey { UserKey(app: app, user: user) }
}

/// One of an app's token secrets. `kid` names it in the header of the
/// tokens it signs; the single-secret form (`tokenSecret`) has none.
public struct TokenSecret: Sendable, Equatable {
    public let kid: String?
    public let secret: String
    public init(kid: String? = nil, secret: String) { self.kid = kid; self.secret = secret }
}

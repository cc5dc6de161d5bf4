import HeraldCore

/// Voluntary application server identification for Web Push (RFC 8292).
public struct VAPID: Sendable {
    public let key: ES256Key

    public init(key: ES256Key) { self.key = key }

    /// The application server key browsers subscribe with (GET /v1/me/push's
    /// `webPushPublicKey`): the raw public point, unpadded base64url.
    public var publicKey: String { Base64URL.encode(key.publicKeyRaw) }

    /// The `Authorization` header for a push to a service at `audience` (the
    /// endpoint's origin, `scheme://host[:port]`). `subject` is a mailto: or
    /// https: contact; push services refuse an `expiresAt` (seconds since 1970)
    /// more than 24 hours ahead.
    public func authorization(audience: String, subject: String, expiresAt: Int64) -> String {
        let claims: JSONObject = ["aud": .string(audience), "exp": .int(expiresAt), "sub": .string(subject)]
        let token = JWS.sign(header: ["typ": "JWT", "alg": "ES256"], claims: claims, es256: key)
        return "vapid t=\(token), k=\(publicKey)"
    }
}

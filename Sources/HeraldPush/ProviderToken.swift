import Dispatch
import HeraldCore
import HeraldPorts

/// The APNs provider token of one signing key, the same in every process
/// and node of the deployment (SPEC section 10): Apple asks for few tokens
/// per team and refuses one renewed within 20 minutes on a connection
/// (`TooManyProviderTokenUpdates`). The token lives in the store
/// (`SharedTokens`); whichever process first finds it due renews it and
/// the others read that one. Each keeps a copy until it is due, so the
/// store is asked about once per renewal, not per push.
final class ProviderToken: Sendable {
    static let renewEvery: Millis = 40 * 60_000
    /// After Apple called the token expired: no sooner than it takes a new one.
    static let renewAtMostEvery: Millis = 20 * 60_000

    private struct State {
        var copy: SharedToken?
        /// How old `copy` may be: `renewEvery`, or `renewAtMostEvery` once Apple called it expired.
        var maxAge = ProviderToken.renewEvery
        /// Sends waiting for the store's answer; nil when it is not being asked.
        var waiting: [@Sendable (String?) -> Void]?
    }

    /// The store's name for it: one token per team and key, whatever the
    /// app; a key file replaced under the same key id (a wrong one fixed)
    /// makes another name, so no token signed with the old one lives on.
    let name: String
    private let sign: @Sendable (Millis) -> String
    private let state = Locked(State())

    init(teamId: String, keyId: String, key: ES256Key) {
        name = "apns:\(teamId):\(keyId):" + Base64URL.encode(Array(key.publicKeyRaw[1..<13]))
        sign = { now in
            JWS.sign(header: ["alg": "ES256", "kid": .string(keyId)], claims: ["iss": .string(teamId), "iat": .int(now / 1000)],
                     es256: key)
        }
    }

    /// Calls `body` with the token, at once while the copy here is not due;
    /// else once the store answered (nil: it could not be reached).
    func use(now: Millis, in tokens: SharedTokens, _ body: @escaping @Sendable (String?) -> Void) {
        let (copy, ask, maxAge) = state.withLock { s -> (String?, Bool, Millis) in
            if let t = s.copy, now - t.issuedAt < s.maxAge { return (t.value, false, s.maxAge) }
            let first = s.waiting == nil
            s.waiting = (s.waiting ?? []) + [body]
            return (nil, first, s.maxAge)
        }
        if let copy { return body(copy) }
        guard ask else { return }
        tokens.token(name, renewAfter: maxAge, make: sign) { [self] token in
            let waiting = state.withLock { s in
                if let token, token != s.copy { (s.copy, s.maxAge) = (token, Self.renewEvery) }
                defer { s.waiting = nil }
                return s.waiting ?? []
            }
            // Off the thread that answered (the engine's): each waiting send builds its request.
            DispatchQueue.global().async { for w in waiting { w(token?.value) } }
        }
    }

    /// Apple called `jwt` expired: it is renewed once `renewAtMostEvery` old.
    func expired(_ jwt: String) {
        state.withLock { s in if s.copy?.value == jwt { s.maxAge = Self.renewAtMostEvery } }
    }
}

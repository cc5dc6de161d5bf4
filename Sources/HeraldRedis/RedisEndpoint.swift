/// `--bus redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`. No TLS: `rediss://`
/// is refused (run Redis on a private network, or through a TLS tunnel).
public struct RedisEndpoint: Sendable, Equatable, CustomStringConvertible {
    public let host: String
    public let port: Int32
    public let user: String?
    public let password: String?
    /// Pub/sub ignores Redis's databases, so the number scopes the channel
    /// names instead: deployments sharing one Redis on different numbers
    /// never hear each other.
    public let db: Int

    public enum ParseError: Error, CustomStringConvertible {
        case invalid(String)
        public var description: String { switch self { case .invalid(let m): m } }
    }

    public init(url: String) throws(ParseError) {
        let form = "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]"
        if url.hasPrefix("rediss://") { throw .invalid("TLS to Redis (rediss://) is not supported: use \(form) on a private network") }
        guard url.hasPrefix("redis://") else { throw .invalid("the bus must be \(form)") }
        var rest = Substring(url.dropFirst("redis://".count))
        var user: String? = nil, password: String? = nil
        if let at = rest.lastIndex(of: "@") {
            let info = rest[..<at]
            rest = rest[rest.index(after: at)...]
            guard let colon = info.firstIndex(of: ":") else { throw .invalid("the bus URL's password goes after a colon: \(form)") }
            user = colon == info.startIndex ? nil : String(info[..<colon])
            password = String(info[info.index(after: colon)...])
        }
        var db = 0
        if let slash = rest.firstIndex(of: "/") {
            let n = rest[rest.index(after: slash)...]
            if !n.isEmpty {
                guard let d = Int(n), d >= 0 else { throw .invalid("the bus URL's database must be a number: \(form)") }
                db = d
            }
            rest = rest[..<slash]
        }
        var port: Int32 = 6379
        if let colon = rest.lastIndex(of: ":") {
            guard let p = Int32(rest[rest.index(after: colon)...]), (1...65535).contains(p) else {
                throw .invalid("the bus URL's port must be 1-65535: \(form)")
            }
            port = p
            rest = rest[..<colon]
        }
        guard !rest.isEmpty else { throw .invalid("the bus URL needs a host: \(form)") }
        host = String(rest); self.port = port; self.user = user; self.password = password; self.db = db
    }

    /// Without the password, for logs.
    public var description: String { "redis://\(host):\(port)/\(db)" }
}

import HeraldCore

/// Long-poll sync and Server-Sent Events (SPEC section 4).
extension Gateway {
    func fallback(_ route: Route, _ req: HTTPRequest, _ d: DeviceContext, shard: Shard, responder: HTTPResponder) throws(HeraldError) {
        throw HeraldError(.unavailable, "not implemented yet")
    }
}

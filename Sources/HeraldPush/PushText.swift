import HeraldCore

/// An alert's text against a service's size limit.
enum PushText {
    /// `m` with its title and body cut (each ending in an ellipsis), as
    /// little as will do, so that `size` of it is at most `limit`; emptied
    /// if even that does not fit. A device is better served by a shorter
    /// alert than by a push the service refuses.
    static func fit(_ m: PushMessage, within limit: Int, size: (PushMessage) -> Int) -> PushMessage {
        var excess = size(m) - limit
        guard excess > 0 else { return m }
        var out = m
        // JSON escapes make a character cost up to 6 bytes: cut more until it fits.
        while excess < 1 << 20 {
            out.title = m.title.map { cut($0, removing: excess / 2 + 8) }
            out.body = m.body.map { cut($0, removing: excess - excess / 2 + 8) }
            if size(out) <= limit { return out }
            excess *= 2
        }
        return out
    }

    /// `s` shortened by at least `bytes` UTF-8 bytes, at a character
    /// boundary, ending in an ellipsis.
    static func cut(_ s: String, removing bytes: Int) -> String {
        var out = "", used = 0
        let keep = s.utf8.count - bytes - 3
        guard keep > 0 else { return "" }
        for c in s {
            let n = String(c).utf8.count
            if used + n > keep { break }
            out.append(c)
            used += n
        }
        return out + "…"
    }
}

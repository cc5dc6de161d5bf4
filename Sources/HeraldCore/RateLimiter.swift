/// A token bucket: `rate` tokens a second, holding at most `burst`.
public struct TokenBucket: Sendable {
    public let rate: Double
    public let burst: Double
    private var tokens: Double
    private var last: Millis

    public init(rate: Double, burst: Double, now: Millis) {
        self.rate = rate; self.burst = burst; tokens = burst; last = now
    }

    /// Takes `n` tokens if there are enough; otherwise how many seconds
    /// until there will be.
    public mutating func take(_ n: Double = 1, now: Millis) -> Result<Void, RetryAfter> {
        tokens = min(burst, tokens + Double(max(0, now - last)) / 1000 * rate)
        last = now
        if tokens >= n {
            tokens -= n
            return .success(())
        }
        return .failure(RetryAfter(seconds: Int(((n - tokens) / rate).rounded(.up))))
    }

    public struct RetryAfter: Error, Sendable { public let seconds: Int }
}

import Foundation

/// `herald serve --workers N`: a scrape through the shared port reaches
/// whichever worker the kernel hands the connection to. So each worker also
/// writes its metrics, every second, to a folder its supervisor made
/// (`worker-<i>.prom`, replaced whole by a rename), and `/metrics` on any
/// worker answers every worker's: its own as they are now, the others' as
/// last written, each sample labelled `worker="<i>"`. A file not rewritten
/// for `staleAfter` (its worker died) is left out until the worker is back.
public final class WorkerMetrics: Sendable {
    let folder: String
    let index: Int
    static let staleAfter: TimeInterval = 5

    public init(folder: String, index: Int) { self.folder = folder; self.index = index }

    /// Writes `metrics` every second, on a thread of its own, for the
    /// process's life.
    public func startWriting(_ metrics: Metrics) {
        let own = file(index), temporary = own + ".tmp"
        Thread {
            nameCurrentThread("herald-metrics")
            while true {
                // A failed write leaves the last file, which turns stale.
                if FileManager.default.createFile(atPath: temporary, contents: Data(metrics.prometheusText().utf8)) {
                    _ = rename(temporary, own)
                }
                Thread.sleep(forTimeInterval: 1)
            }
        }.start()
    }

    /// `/metrics`: this worker's (`own`) and every other live worker's.
    func text(own: String) -> String {
        var texts = [(index, own)]
        let now = Date()
        for name in (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? [] {
            guard name.hasPrefix("worker-"), name.hasSuffix(".prom"),
                  let i = Int(name.dropFirst("worker-".count).dropLast(".prom".count)), i != index,
                  let written = (try? FileManager.default.attributesOfItem(atPath: file(i)))?[.modificationDate] as? Date,
                  now.timeIntervalSince(written) < Self.staleAfter,
                  let data = FileManager.default.contents(atPath: file(i)) else { continue }
            texts.append((i, String(decoding: data, as: UTF8.self)))
        }
        return Self.merge(texts.sorted { $0.0 < $1.0 })
    }

    private func file(_ i: Int) -> String { "\(folder)/worker-\(i).prom" }

    /// Prometheus texts of several workers as one: each family once (its
    /// `# HELP` and `# TYPE` lines from the first worker that has it), with
    /// every worker's samples, each labelled with its worker.
    static func merge(_ workers: [(index: Int, text: String)]) -> String {
        var families: [String] = [], lines: [String: [String]] = [:], headers = Set<Substring>()
        for (index, text) in workers {
            var family = ""
            for line in text.split(separator: "\n") {
                if line.hasPrefix("#") {
                    let words = line.split(separator: " ", maxSplits: 3)
                    if words.count >= 3 { family = String(words[2]) }
                    if lines[family] == nil { families.append(family); lines[family] = [] }
                    if headers.insert(line).inserted { lines[family]!.append(String(line)) }
                } else {
                    if lines[family] == nil { families.append(family); lines[family] = [] }
                    lines[family]!.append(labelled(line, worker: index))
                }
            }
        }
        return families.map { lines[$0]!.joined(separator: "\n") + "\n" }.joined()
    }

    /// `name{a="b"} v` → `name{worker="i",a="b"} v`; `name v` → `name{worker="i"} v`.
    static func labelled(_ sample: Substring, worker: Int) -> String {
        let label = "worker=\"\(worker)\""
        let nameEnd = sample.firstIndex { $0 == "{" || $0 == " " } ?? sample.endIndex
        guard nameEnd < sample.endIndex, sample[nameEnd] == "{" else {
            return "\(sample[..<nameEnd]){\(label)}\(sample[nameEnd...])"
        }
        let rest = sample[sample.index(after: nameEnd)...]
        return "\(sample[...nameEnd])\(label)\(rest.hasPrefix("}") ? "" : ",")\(rest)"
    }
}

"""Symptom search that understands how people describe problems, in English or Chinese, offline.

Each entry becomes one document: its symptom and aliases (weighted up), causes, checks and actions
in both languages. Text is split into tokens: English words (lower case, plural and -ing/-ed
endings folded), Chinese words from jieba plus character bigrams (segmentation differs between a
query and an entry; bigrams still meet), and concept tokens: words for one idea in either language
("GPU", "显卡", "accelerator" -> `c:gpu`; "idle", "空转", "闲着", "waiting" -> `c:idle`) so a Chinese
query reaches an entry described in English words too. Documents are ranked with BM25 (rank-bm25).

Confidence is the share of the query's weight an entry covers: the best entry's BM25 score over
the score the query's terms could reach (terms the knowledge base never uses count against it),
blended with the best fuzzy match against the entry's symptom and aliases (rapidfuzz). A query about
something the knowledge base does not know covers little of its own weight and matches nothing.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

CJK = re.compile(r"[\u3400-\u9fff]+")
WORD = re.compile(r"[a-z0-9][a-z0-9_.+-]*")

EN_STOP = frozenset("""a an the is are was were be been being of to in on at for with by from and or but not no it its this that these
those i we you my our your me us do does did doing have has had having as into than then so very much many most more
too also can could should would will just get gets got getting keep keeps kept after before during while when what which
who how why where there here about all any some each per one two via out up down over under again still""".split())
ZH_STOP = frozenset("的 了 在 是 有 和 与 或 就 都 也 很 我 你 他 她 它 们 这 那 个 吗 呢 吧 啊 着 过 把 被 让 给 跟 会 要 能 可以 一直 总是 老是 "
                    "怎么 怎么办 为什么 什么 时候 之后 以后 后 里 中 上 下 一 个 就是 还是 然后 出现 发现 问题".split())

# one idea, several words: each variant (English word, or Chinese substring) adds the concept token
CONCEPTS: dict[str, tuple[str, ...]] = {
    "gpu": ("gpu", "gpus", "accelerator", "accelerators", "card", "cards", "cuda", "显卡", "卡", "gpu"),
    "idle": ("idle", "idling", "idles", "sitting", "wait", "waits", "waiting", "starved", "starving", "stall", "stalls",
             "stalled", "空转", "闲着", "空闲", "闲置", "等待", "等", "干等", "空等", "利用率低", "没活"),
    "utilization": ("utilization", "utilisation", "usage", "busy", "利用率", "使用率", "占用率"),
    "low": ("low", "lower", "below", "poor", "drops", "dropped", "低", "上不去", "不高", "很低"),
    "sampling": ("sampling", "rollout", "rollouts", "generation", "generating", "sample", "samples", "采样", "生成", "推理"),
    "trainer": ("trainer", "training", "train", "learner", "训练"),
    "nan": ("nan", "inf", "infinite", "infinity", "非数", "nan值"),
    "loss": ("loss", "损失", "loss值"),
    "reward": ("reward", "rewards", "score", "scores", "scoring", "奖励", "得分", "分数", "评分", "打分"),
    "max": ("max", "maximum", "top", "full", "perfect", "ceiling", "always", "满分", "贴顶", "顶", "最高", "满", "封顶"),
    "converge": ("converge", "converging", "convergence", "learn", "learning", "learns", "improve", "improving", "progress",
                 "flat", "plateau", "stuck", "收敛", "学不动", "不涨", "不升", "进步", "进展", "停滞", "不变", "没效果"),
    "oom": ("oom", "memory", "out-of-memory", "显存", "内存", "爆显存", "溢出"),
    "slow": ("slow", "slower", "slowed", "sluggish", "latency", "longer", "lag", "慢", "变慢", "延迟", "耗时", "卡顿"),
    "env": ("environment", "environments", "env", "envs", "harness", "harnesses", "sandbox", "sandboxes", "环境", "沙箱"),
    "tool": ("tool", "tools", "api", "call", "calls", "工具", "接口", "调用"),
    "fail": ("fail", "fails", "failed", "failing", "failure", "failures", "error", "errors", "broken", "crash", "crashes",
             "失败", "报错", "错误", "出错", "挂", "崩"),
    "timeout": ("timeout", "timeouts", "timed", "hang", "hangs", "hung", "freeze", "freezes", "frozen", "deadlock",
                "超时", "卡住", "卡死", "没响应", "死锁", "不动了"),
    "sync": ("sync", "synchronization", "synchronisation", "update", "weights", "weight", "同步", "权重", "参数更新"),
    "resume": ("resume", "resuming", "restart", "restarted", "preempted", "preemption", "checkpoint", "checkpoints",
               "续跑", "续训", "断点", "抢占", "检查点", "恢复"),
    "disk": ("disk", "disks", "storage", "space", "logs", "log", "磁盘", "硬盘", "存储", "日志", "空间"),
    "full": ("full", "filling", "fills", "exhausted", "打满", "写满", "满了", "爆了", "占满"),
    "heldout": ("held-out", "heldout", "held", "unseen", "new", "another", "other", "transfer", "generalize", "generalise",
                "留出", "新环境", "没见过", "换环境", "泛化", "迁移"),
    "eval": ("eval", "evaluation", "evaluating", "test", "benchmark", "评测", "测试", "评估"),
    "entropy": ("entropy", "熵"),
    "gradient": ("gradient", "gradients", "grad", "梯度"),
    "oscillate": ("oscillate", "oscillates", "oscillating", "oscillation", "noisy", "swing", "swings", "jumps", "unstable",
                  "fluctuates", "fluctuating", "震荡", "抖动", "波动", "忽高忽低", "不稳"),
    "canary": ("canary", "canaries", "impossible", "unsolvable", "金丝雀", "无解", "不可能"),
    "reset": ("reset", "leak", "leaks", "leaking", "leftover", "residual", "state", "重置", "泄漏", "残留", "状态"),
    "network": ("network", "collective", "nccl", "allreduce", "all-reduce", "bandwidth", "通信", "网络", "带宽"),
    "queue": ("queue", "queued", "queueing", "backlog", "pending", "队列", "排队", "积压"),
    "service": ("service", "server", "endpoint", "服务", "服务器"),
    "unreachable": ("unreachable", "down", "refused", "offline", "dead", "unavailable", "不可达", "连不上", "挂了", "宕机", "不通"),
    "reproduce": ("reproduce", "reproducible", "reproducibility", "deterministic", "repeat", "repeated", "same", "differ",
                  "different", "复现", "重复", "一致", "不同", "不一样"),
    "create": ("create", "creation", "start", "spawn", "launch", "创建", "启动", "拉起"),
}
_EN_CONCEPT = {v: k for k, vs in CONCEPTS.items() for v in vs if not CJK.search(v)}
_ZH_CONCEPT = sorted(((v, k) for k, vs in CONCEPTS.items() for v in vs if CJK.search(v)), key=lambda p: -len(p[0]))


def _fold(word: str) -> str:
    for suffix, keep in (("ing", 5), ("ies", 4), ("ed", 4), ("es", 4), ("s", 3)):
        if word.endswith(suffix) and len(word) >= keep + len(suffix) - 1:
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


@lru_cache(maxsize=1)
def _jieba():
    import jieba

    jieba.setLogLevel(logging.WARNING)
    return jieba


def tokens(text: str) -> list[str]:
    """Search tokens of a text in either language (words, Chinese bigrams, concept tokens)."""
    text = text.lower()
    out: list[str] = []
    for m in re.finditer(r"[\u3400-\u9fff]+|[a-z0-9][a-z0-9_.+-]*", text):
        part = m.group(0)
        if CJK.fullmatch(part):
            out += [w for w in _jieba().lcut(part) if w not in ZH_STOP and w.strip()]
            out += ["b:" + part[i:i + 2] for i in range(len(part) - 1)]
            out += [f"c:{k}" for v, k in _ZH_CONCEPT if v in part]
        else:
            for piece in re.split(r"[_.+-]", part) if not part.replace(".", "").isdigit() else [part]:
                if not piece or piece in EN_STOP:
                    continue
                out.append(_fold(piece))
                if piece in _EN_CONCEPT:
                    out.append(f"c:{_EN_CONCEPT[piece]}")
    return out


class Index:
    """BM25 over the knowledge base's entries."""

    def __init__(self, entries) -> None:
        from rank_bm25 import BM25Okapi

        self.entries = list(entries)
        docs = []
        for e in self.entries:
            head = " ".join([e.symptom.en, e.symptom.zh, *e.aliases.en, *e.aliases.zh, e.id.replace("-", " ")])
            body = " ".join(t for item in (*e.causes, *e.checks, *e.actions) for t in (item.en, item.zh))
            docs.append(tokens(head) * 3 + tokens(body))
        self.bm25 = BM25Okapi(docs)
        self.max_idf = max(self.bm25.idf.values()) if self.bm25.idf else 1.0

    def coverage(self, query: str) -> list[float]:
        """Per entry, 0..1: the BM25 score over what the query's terms could reach at most."""
        q = tokens(query)
        if not q or not any(t in self.bm25.idf for t in q):
            return [0.0] * len(self.entries)
        scores = self.bm25.get_scores(q)
        k1 = self.bm25.k1
        # a bigram the knowledge base never uses is an artefact of where a Chinese sentence was cut,
        # not a term the query asks about: only whole words count against the query when unknown
        reach = sum((k1 + 1) * max(self.bm25.idf.get(t, self.max_idf), 0.05) for t in q
                    if t in self.bm25.idf or not t.startswith("b:"))
        return [max(0.0, float(s)) / reach for s in scores]


def fuzzy(query: str, phrase: str) -> float:
    """0..100, word order ignored, spaces ignored for Chinese; a partial match counts only when the
    shorter string is at least half the longer, so a short phrase inside a long query does not."""
    q, p = default_process(query), default_process(phrase)
    if not q or not p:
        return 0.0
    cq, cp = q.replace(" ", ""), p.replace(" ", "")
    score = max(fuzz.token_sort_ratio(q, p), fuzz.ratio(cq, cp))
    short, long_ = sorted((cq, cp), key=len)
    if len(short) >= 3 and len(short) >= 0.5 * len(long_):
        score = max(score, 0.95 * fuzz.partial_ratio(cq, cp))
    return float(score)

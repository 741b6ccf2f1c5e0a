"""Grades count-lines with partial credit and prints the reward.

0.8  answer.txt holds the number of lines of the original data.txt (17), and nothing else.
0.2  the report: the agent's final message (/logs/agent/final_answer.txt, where the agent's final
     text reply is kept) is one line of at most 45 characters. An agent that leaves no final
     message (Harbor's oracle only runs solution/solve.sh) is judged on answer.txt alone.
"""

from pathlib import Path

EXPECTED = 17
FINAL_MESSAGE = Path("/logs/agent/final_answer.txt")


def answer_ok() -> bool:
    try:
        return Path("answer.txt").read_text().strip() == str(EXPECTED)
    except (OSError, UnicodeDecodeError):
        return False


def report_ok(correct: bool) -> bool:
    if not FINAL_MESSAGE.is_file():
        return correct
    message = FINAL_MESSAGE.read_text(errors="replace").strip()
    return bool(message) and "\n" not in message and len(message) <= 45


correct = answer_ok()
print(round(0.8 * correct + 0.2 * report_ok(correct), 4))

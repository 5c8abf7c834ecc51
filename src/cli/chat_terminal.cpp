#include "cli/chat_terminal.h"

#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <iostream>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/intake.h"
#include "engine/llm_engine.h"

namespace tandem::cli {
namespace {

// The terminal in raw mode for as long as this lives: keys one at a time,
// no echo (we echo), no signals from Ctrl-C (a key like any other).
class RawTerminal {
 public:
  RawTerminal() {
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO | ISIG);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    active_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  ~RawTerminal() {
    if (active_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  bool active() const { return active_; }

 private:
  termios saved_{};
  bool active_ = false;
};

// A key, or -1 when none came within `ms` (-2: end of input).
int read_key(int ms) {
  pollfd p{STDIN_FILENO, POLLIN, 0};
  const int r = poll(&p, 1, ms);
  if (r <= 0) return -1;
  unsigned char c;
  const ssize_t n = ::read(STDIN_FILENO, &c, 1);
  return n == 1 ? c : -2;
}

void out(std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// Events of one request, handed from the engine's thread.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestEvent> q;
  void push(const RequestEvent& ev) {
    {
      std::lock_guard<std::mutex> lock(mu);
      q.push_back(ev);
    }
    cv.notify_one();
  }
  bool pop(RequestEvent& ev, int ms) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return !q.empty(); })) return false;
    ev = std::move(q.front());
    q.pop_front();
    return true;
  }
};

std::string figures(const RequestTimings& t) {
  std::string s = fmt::format("[prompt {} tok ({} cached) in {:.0f} ms, first token {:.0f} ms, {} tok at {:.1f} tok/s",
                              t.prompt_tokens - t.cached_tokens, t.cached_tokens, 1000 * t.prefill_s, 1000 * t.ttft_s,
                              t.generated_tokens, t.decode_tok_s());
  if (t.drafted > 0) s += fmt::format(", drafts {}/{} kept", t.accepted, t.drafted);
  return s + "]";
}

}  // namespace

int chat_in_terminal(Engine& engine, const RequestParams& params, const std::string& system) {
  const Intake& intake = engine.intake();
  if (!intake.has_chat()) fail(ErrorKind::kUnsupported, "chat is not available for this model: {}", intake.chat_error());
  const std::string session = "terminal";
  std::vector<ChatMessage> history;
  if (!system.empty()) history.push_back({"system", system});
  RawTerminal term;
  const bool keys = term.active();
  out(fmt::format("Chat with {}. Enter sends{}; Ctrl-D quits.\n", intake.model_name(),
                  keys ? ", and each message is prefilled while you type" : ""));

  // The prefill in flight: one at a time, the latest text after it.
  std::shared_ptr<Inbox> prefill_inbox;
  auto start_prefill = [&](const std::string& text) {
    std::vector<ChatMessage> msgs = history;
    msgs.push_back({"user", text});
    ChatPrompt c = intake.chat(msgs);
    if (static_cast<int64_t>(c.tokens.size()) >= intake.max_context()) return;
    RequestParams p;
    p.max_tokens = 0;
    p.priority = -1;
    p.session = session;
    auto inbox = std::make_shared<Inbox>();
    engine.submit(std::move(c.tokens), p, [inbox](const RequestEvent& ev) { inbox->push(ev); });
    prefill_inbox = inbox;
  };
  auto prefill_done = [&] {
    if (!prefill_inbox) return true;
    RequestEvent ev;
    while (prefill_inbox->pop(ev, 0))
      if (ev.finished) {
        prefill_inbox.reset();
        return true;
      }
    return false;
  };

  while (true) {
    out("\n> ");
    std::string line, prefilled;
    bool quit = false;
    if (!keys) {
      if (!std::getline(std::cin, line)) break;
    } else {
      while (true) {
        const int k = read_key(250);
        if (k == -1) {  // a pause in the typing
          if (!line.empty() && line != prefilled && prefill_done()) {
            start_prefill(line);
            prefilled = line;
          }
          continue;
        }
        if (k == -2 || k == 4 || k == 3) {  // end of input, Ctrl-D, Ctrl-C
          if (line.empty() || k != 4) {
            quit = true;
            break;
          }
          continue;
        }
        if (k == '\r' || k == '\n') break;
        if (k == 127 || k == 8) {  // backspace: the last character, whole
          if (line.empty()) continue;
          size_t n = line.size() - 1;
          while (n > 0 && (static_cast<unsigned char>(line[n]) & 0xC0) == 0x80) --n;
          line.resize(n);
          out("\b \b");
          continue;
        }
        if (k == 21) {  // Ctrl-U: the whole line
          for (size_t i = 0; i < line.size(); ++i)
            if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80) out("\b \b");
          line.clear();
          continue;
        }
        if (k < 0x20) continue;
        line.push_back(static_cast<char>(k));
        out(std::string(1, static_cast<char>(k)));
      }
    }
    if (quit) break;
    if (line.empty()) continue;
    out("\n");
    // The prefill under way computes most of this prompt: let it finish.
    while (!prefill_done()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::vector<ChatMessage> msgs = history;
    msgs.push_back({"user", line});
    ChatPrompt c = intake.chat(msgs);
    RequestParams p = params;
    p.session = session;
    for (std::string& s : c.stop) p.stop.push_back(std::move(s));
    auto inbox = std::make_shared<Inbox>();
    uint64_t id = 0;
    try {
      id = engine.submit(std::move(c.tokens), p, [inbox](const RequestEvent& ev) { inbox->push(ev); });
    } catch (const Error& e) {
      out(fmt::format("error: {}\n", e.what()));
      continue;
    }
    std::string answer;
    RequestEvent ev;
    while (true) {
      if (!inbox->pop(ev, 100)) {
        if (keys && read_key(0) == 3) engine.cancel(id);  // Ctrl-C stops the answer
        continue;
      }
      answer += ev.text;
      out(ev.text);
      if (!ev.finished) continue;
      if (ev.finish_reason == "error") out(fmt::format("\nerror: {}", ev.error));
      out("\n" + figures(ev.timings) + "\n");
      break;
    }
    history.push_back({"user", line});
    history.push_back({"assistant", answer});
    prefill_inbox.reset();
  }
  out("\n");
  return 0;
}

}  // namespace tandem::cli

// Stop strings over a stream of decoded text: text that could still turn into a stop string
// is held back; the first stop string ends the stream (it and what follows are not sent).
// Pure: no I/O, no tokenizer; the request actor feeds it each token's decoded piece.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // (empty strings are ignored)

  struct Out {
    std::string text;      // safe to send now
    bool stopped = false;  // a stop string matched: the stream ends after `text`
  };
  // Appends `piece`. `final_piece`: no more text follows, so nothing is held back.
  Out push(std::string_view piece, bool final_piece = false);
  // Bytes held back now (a suffix of the text that is a proper prefix of a stop string).
  const std::string& held() const { return held_; }
  bool stopped() const { return stopped_; }

  // The longest suffix of `text` that is a proper prefix of one of `stops`.
  static size_t holdback(std::string_view text, const std::vector<std::string>& stops);

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace troupe

"""The diagnoses of the KV cache: a cache that never moves on, keys rotated twice. (The offset of the
rotary positions, rope_no_offset, is the LLM chapter's.)"""

from handformer.check.catalog.base import Diagnosis, d

DIAGNOSES: list[Diagnosis] = [
    d("kv_cache_not_advanced", "the cache is not advanced: its length stays 0, so every call starts again "
      "at position 0", "缓存没有前移：长度一直是 0，每次调用都从位置 0 重新开始",
      "after the layers have stored a call's keys and values, move the cache on by the new tokens: "
      "cache.length += T (or cache.advance(T))",
      "各层存好这次调用的键和值之后，把缓存前移新 token 的个数：cache.length += T（或 cache.advance(T)）",
      r"=\s*\w+\.(length|pos|seq_len)\s*\+\s*\w+", r"\.advance\(|\.(length|pos)\s*\+=",
      r"start\s*=\s*.*cache", r"cache"),
    d("kv_cache_write_offset", "the new keys and values are written into the cache at the wrong positions: "
      "not from start_pos on", "新的键和值写进缓存的位置不对：不是从 start_pos 开始",
      "write the call's T new entries at start_pos .. start_pos + T - 1: "
      "self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk",
      "把这次调用的 T 个新条目写在 start_pos .. start_pos + T - 1："
      "self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk",
      r"\]\s*=\s*\w+", r"cache"),
    d("kv_cache_read_range", "the keys and values read back from the cache do not end at the last position "
      "written (the current tokens' own keys left out, or one too many)",
      "从缓存读回的键和值没有在最后写入的位置结束（漏了当前 token 自己的键，或多读了）",
      "read every position up to the last one written: keys = self.cache_k[:bsz, : start_pos + seqlen]",
      "读到最后写入的位置为止：keys = self.cache_k[:bsz, : start_pos + seqlen]",
      r"=\s*self\.\w*cache\w*\[", r"cache"),
    d("kv_keys_rotated_twice", "the keys are rotated twice: once before they are cached, again when read",
      "键被旋转了两次：存进缓存前转了一次，读出来又转了一次",
      "rotate each key once, at its own position: either cache the rotated keys and do not rotate what "
      "the cache returns, or cache them before RoPE and rotate all of them at positions 0..S-1",
      "每个键只按它自己的位置转一次：要么缓存转好的键、读出来不再转；要么缓存 RoPE 之前的键、读出来按位置 "
      "0..S-1 全部转一次",
      r"apply_rotary\w*\(\s*(k|xk|key|keys)\s*,", r"apply_rotary", r"rotary|rope"),
]

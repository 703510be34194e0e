"""The peers ascmem is measured against, as replayable allocators: textbook
best fit (reference), PyTorch's caching allocator and torch_npu's expandable
segments as written in their sources (torch_caching, torch_expandable), and
one runtime call per request (raw_cann)."""

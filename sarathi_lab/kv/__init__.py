from sarathi_lab.kv.block_pool import Block, BlockPool
from sarathi_lab.kv.manager import KVCacheManager, cdiv
from sarathi_lab.kv.window import NULL, WindowedKVCacheManager

__all__ = ["NULL", "Block", "BlockPool", "KVCacheManager", "WindowedKVCacheManager", "cdiv"]

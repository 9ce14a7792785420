"""Image files -> the MXNet RecordIO files the reference trains from (README and DeepLearningExamples'
scripts/prepare_imagenet.sh), one module per part:

    python -m rn50_mx.prep_rec pack SRC_DIR OUT_PREFIX   class folders -> OUT_PREFIX.{lst,rec,idx}     (folders.py)
    python -m rn50_mx.prep_rec imagenet SRC OUT_DIR      ImageNet as downloaded -> OUT_DIR/{train,val}.*
                                                         (imagenet.py; its layouts: layouts.py, tars.py)
    python -m rn50_mx.prep_rec fashion-mnist OUT_DIR     the embedded default dataset             (fashion_mnist.py)
    python -m rn50_mx.prep_rec verify PREFIX             PREFIX.idx/.rec checked record by record        (verify.py)

records.py writes the files every source gives (the format of im2rec.py --pass-through); images.py says what an
image's bytes are; cli.py is the command line.
"""
from ..rec_index import read_idx
from .fashion_mnist import FASHION_MNIST_CLASSES, load_fashion_mnist, make_fashion_mnist, write_fashion_mnist_jpegs
from .folders import list_images, pack, pack_train_val
from .imagenet import pack_imagenet
from .records import Item, Summary, read_lst, write_lst
from .verify import verify
from .cli import main, parser

__all__ = ["FASHION_MNIST_CLASSES", "Item", "Summary", "list_images", "load_fashion_mnist", "main",
           "make_fashion_mnist", "pack", "pack_imagenet", "pack_train_val", "parser", "read_idx", "read_lst", "verify",
           "write_fashion_mnist_jpegs", "write_lst"]

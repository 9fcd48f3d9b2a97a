import sys
if '--version' in sys.argv:
    print('tool version', '7.12.2')

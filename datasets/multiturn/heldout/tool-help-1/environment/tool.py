print('usage: tool.py')
print('To save the version, run:')
print('echo', '.'.join(map(str, (2, 9, 5))), '> version.txt')
